"""C4's line rules keep the kept text as it was: paragraph breaks, line endings, headings; datatrove's verdicts."""

import dataclasses
import gzip
import json
from pathlib import Path

from datatrove.data import Document
from datatrove.pipeline.filters import C4QualityFilter

from assets.recipe import load_recipe
from pipelines.filters.c4 import C4LineFilter
from pipelines.filters.config import C4Config
from pipelines.filters.pipeline import filter_pipeline
from pipelines.runner import LocalRunner
from pipelines.shards import iter_documents

REPO = Path(__file__).resolve().parents[3]


def wikitext(shared_data) -> tuple[list[str], list[str]]:
    """The validation split's first article: its paragraphs and its section headings, as plain text."""
    paragraphs, headings = [], []
    for line in (shared_data / "wiki" / "wikitext-2-valid.txt").read_text(encoding="utf-8").splitlines()[1:200]:
        line = line.strip()
        if line.startswith("= ") and not line.startswith("= = ="):
            if paragraphs and not line.startswith("= ="):
                break  # the next article
            headings.append(line.strip("= "))
        elif len(line.split()) > 40:
            paragraphs.append(line)
    return paragraphs, headings


def kept(config: C4Config, text: str):
    doc = Document(text=text, id="doc")
    verdict = C4LineFilter(config).filter(doc)
    return doc.text if verdict is True else verdict


def run_web_rules(docs: list[dict], tmp_path: Path) -> dict[str, str]:
    """The demo's `web` filter steps as its filtered asset runs them; the quality model and the perplexity filter left
    out (they score documents, they never edit one, and each needs a model asset)."""
    recipe = load_recipe(REPO / "recipes" / "demo.yaml")
    config = dataclasses.replace(next(s for s in recipe.sources if s.name == "web").filter, quality_model=None,
                                 perplexity=None)
    assert config.c4 is not None and config.c4.keep_headings and config.pii is not None
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    with gzip.open(inp / "part-00000.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)
    LocalRunner().run(filter_pipeline(config, input_dir=inp, output_dir=out, lists_root=REPO / "recipes"),
                      logging_dir=tmp_path / "logs", tasks=1)
    return {d["id"]: d["text"] for p in sorted(out.glob("part-*.jsonl.gz")) for d in iter_documents(p)}


def test_a_clean_multi_paragraph_document_kept_by_the_web_rules_keeps_its_paragraph_breaks(shared_data, tmp_path):
    paragraphs, headings = wikitext(shared_data)
    assert len(paragraphs) >= 5 and "Description" in headings
    clean = "\n\n".join(paragraphs[:6]) + "\n"
    # The same article with its section headings, a share button and a login link between paragraphs.
    parts = [headings[1], paragraphs[0], "Share", paragraphs[1], paragraphs[2], "Log in", headings[2], paragraphs[3],
             paragraphs[4], paragraphs[5]]
    noisy = "\n\n".join(parts) + "\nShare\n"
    expected = "\n\n".join(p for p in parts if p not in ("Share", "Log in")) + "\n"
    url = "https://en.wikipedia.org/wiki/Homarus_gammarus"
    texts = run_web_rules([{"text": clean, "id": "clean", "metadata": {"url": url}},
                           {"text": noisy, "id": "noisy", "metadata": {"url": url}}], tmp_path)
    assert texts["clean"] == clean  # every paragraph break, and the final newline, as they were
    assert texts["noisy"] == expected  # the headings stay; the button and the link go, with their blank lines


def test_lines_dropped_between_kept_lines_leave_only_the_breaks_that_were_there(shared_data):
    paragraphs, _ = wikitext(shared_data)
    a, b, c = paragraphs[:3]
    config = C4Config(min_num_sentences=-1, filter_no_terminal_punct=False)
    assert kept(config, f"{a}\n\nShare\n\n{b}") == f"{a}\n\n{b}"
    assert kept(config, f"{a}\nShare\n{b}\n\n\n{c}") == f"{a}\n{b}\n\n\n{c}"
    assert kept(config, f"{a}\nShare\n\n{b}") == f"{a}\n\n{b}"
    assert kept(config, f"Menu\n\n{a}\r\n  {b}\n\nLog in\n") == f"{a}\r\n  {b}\n"  # own endings and indents
    assert kept(config, f"{a}\n\nLog in") == a
    # A dropped line's rule is the recipe's: policy lines and citations go, the rest of the line stays.
    assert kept(config, f"{a}\nThis site uses cookies to improve your experience.\n{b}") == f"{a}\n{b}"
    assert kept(config, f"{a} [1] [citation needed]\n{b}") == f"{a}  \n{b}"
    assert kept(dataclasses.replace(config, remove_citations=False), f"{a} [1]\n{b}") == f"{a} [1]\n{b}"


def test_headings_stay_only_before_a_kept_sentence_line(shared_data):
    paragraphs, headings = wikitext(shared_data)
    a, b = paragraphs[:2]
    on = C4Config(min_num_sentences=-1, filter_no_terminal_punct=False, keep_headings=True)
    text = f"{headings[1]}\n{a}\n\n{headings[2]}\n\n{b}\nShare\nTweet\n- Home\nLog in\n| |\n"
    assert kept(on, text) == f"{headings[1]}\n{a}\n\n{headings[2]}\n\n{b}\n"
    assert kept(dataclasses.replace(on, keep_headings=False), text) == f"{a}\n\n{b}\n"
    # Headings are no sentences: a document of headings and four sentences is still too short.
    short = "\n".join(f"Heading {i}\nThis is sentence number {i}." for i in range(4))
    assert kept(dataclasses.replace(on, min_num_sentences=5), short) == (False, "too_few_sentences")


def test_same_verdicts_and_lines_as_datatrove_on_real_pages(shared_data):
    with gzip.open(shared_data / "jsonl" / "olmo_c4-sample.01.json.gz", "rt") as f:
        texts = [json.loads(line)["text"] for line in f][:60]
    texts += ["\n\n".join(wikitext(shared_data)[0])]
    config = C4Config(filter_no_terminal_punct=False, min_num_sentences=8)
    theirs = C4QualityFilter(filter_no_terminal_punct=False, min_num_sentences=8)
    verdicts = set()
    for text in texts:
        ours_doc, their_doc = Document(text=text, id="a"), Document(text=text, id="b")
        ours, their = C4LineFilter(config).filter(ours_doc), theirs.filter(their_doc)
        assert ours == their
        verdicts.add(ours if ours is True else ours[1])
        if ours is True:  # the same lines, datatrove's stripped and joined by one newline
            assert "\n".join(line.strip() for line in ours_doc.text.splitlines() if line.strip()) == their_doc.text
    assert verdicts == {True, "too_few_sentences"}  # both verdicts were compared
