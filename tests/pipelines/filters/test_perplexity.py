"""pipelines.filters.perplexity on real text: one reference model, trained once for the module by our trainer on US
State of the Union addresses, scores wikitext paragraphs below the same paragraphs with their words shuffled and
below the navigation and footer text of the crawl's English pages; the filter keeps and drops by threshold and by
band, and passes other languages unscored; a document's score and verdict are its own, whatever documents share its
batch or task."""

from __future__ import annotations

import gzip
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import lxml.html
import pytest
from datatrove.data import Document

from pipelines.filters.config import FilterConfig, PerplexityConfig
from pipelines.filters.perplexity import (
    REFERENCE_FILE,
    PerplexityFilter,
    ReferenceModel,
    export,
    read_reference_text,
    reference_paragraphs,
)
from pipelines.filters.pipeline import filter_pipeline
from pipelines.ingest.warc import WarcEntry, read_warc
from pipelines.runner import LocalRunner
from pipelines.shards import iter_documents
from pipelines.tokenization.config import TokenizerConfig
from pipelines.tokenization.tokenizer import train_tokenizer
from tests.conftest import REPO, SHARED_DATA


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory) -> Path:
    """A reference model of 600 KB of the addresses: 96 steps of a 2-layer model (~10 s), exported with its
    validation figures on 40 KB of the inaugural addresses."""
    work = tmp_path_factory.mktemp("reference")
    paragraphs = reference_paragraphs(read_reference_text(SHARED_DATA / "misc" / "state_union.zip"))
    text = "\n\n".join(paragraphs)[:600_000]
    (work / "train.txt").write_text(text)
    train_tokenizer([text], TokenizerConfig(vocab_size=1024)).save(str(work / "tokenizer.json"))
    val = reference_paragraphs(read_reference_text(SHARED_DATA / "misc" / "inaugural.zip"))
    (work / "val.txt").write_text("\n".join(val)[:40_000])
    run = {"data": {"text": str(work / "train.txt"), "tokenizer": str(work / "tokenizer.json"), "val_fraction": 0.01},
           "train_tokens": 96 * 16 * 64, "output_dir": str(work / "run"),
           "model": {"vocab_size": 1024, "d_model": 64, "n_layers": 2, "n_heads": 4},
           "optim": {"lr": 3e-3}, "schedule": {"kind": "cosine", "warmup_tokens": 8192},
           "batch": {"global_batch": 16, "micro_batch": 16, "seq_len": 64},
           "metrics": {"log_interval": 32, "eval_batches": 1, "tensorboard": False},
           "checkpoint": {"interval_steps": 0, "keep_last": 1}, "guard": {"enabled": False}}
    (work / "run.json").write_text(json.dumps(run))
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(REPO / ".venv" / "torch_extensions")}
    subprocess.run([sys.executable, "-m", "trainer", "--config", str(work / "run.json")], check=True, env=env,
                   cwd=REPO, capture_output=True)
    export(work / "run" / "checkpoints", work / "tokenizer.json", [work / "val.txt"], 64, work / "model")
    return work / "model"


@pytest.fixture(scope="module")
def model(reference_dir) -> ReferenceModel:
    return ReferenceModel(reference_dir, device="cpu")


def wikitext(n: int) -> list[str]:
    return reference_paragraphs(read_reference_text(SHARED_DATA / "wiki" / "wikitext-2-valid.txt"), min_words=40)[:n]


def shuffled(paragraphs: list[str]) -> list[str]:
    rng = random.Random(0)
    out = []
    for paragraph in paragraphs:
        words = paragraph.split()
        rng.shuffle(words)
        out.append(" ".join(words))
    return out


def boilerplate(n: int) -> list[str]:
    """The text of the <nav> and <footer> elements of the crawl's English pages (lang="en..."): menus, link lists,
    copyright lines, what an extractor leaves out; each of at least 8 words."""
    found = []
    for entry in read_warc(SHARED_DATA / "crawl" / "web-pages.warc.gz", max_payload_bytes=5 << 20):
        if not isinstance(entry, WarcEntry) or entry.rec_type != "response" or not entry.payload:
            continue
        try:
            root = lxml.html.fromstring(entry.payload)
        except (ValueError, lxml.etree.ParserError):
            continue
        if not (root.get("lang") or "").lower().startswith("en"):
            continue
        for element in root.iter("nav", "footer"):
            text = " ".join(" ".join(element.itertext()).split())
            if len(text.split()) >= 8:
                found.append(text)
        if len(found) >= n:
            return found[:n]
    return found


@pytest.mark.slow
def test_the_exported_model_reports_its_validation_figures(reference_dir):
    info = json.loads((reference_dir / REFERENCE_FILE).read_text())
    # Learned something: far below a uniform guess over its 1,024 tokens.
    assert info["val_perplexity"] < 1024 / 2
    assert info["val_paragraphs"] > 10 and info["val_tokens"] > 5_000
    assert info["val_percentiles"] == sorted(info["val_percentiles"]) and len(info["val_percentiles"]) == 101


@pytest.mark.slow
def test_wikitext_scores_below_its_shuffled_words_and_below_boilerplate(model):
    wiki = wikitext(60)
    real, mixed = model.perplexities(wiki), model.perplexities(shuffled(wiki))
    assert all(a < b for a, b in zip(real, mixed)), [(a, b) for a, b in zip(real, mixed) if a >= b]
    menus = model.perplexities(boilerplate(60))
    assert len(menus) == 60
    assert statistics.median(real) < statistics.median(menus)
    # Most of the boilerplate is above the typical wikitext paragraph.
    assert sum(m > statistics.median(real) for m in menus) >= 0.7 * len(menus)


@pytest.mark.slow
def test_the_filter_keeps_by_threshold_and_by_band_and_passes_other_languages(reference_dir, model):
    wiki = wikitext(16)
    texts = wiki + shuffled(wiki)
    scores = [round(s, 2) for s in model.perplexities(texts)]  # the recorded values, which decide
    middle = statistics.median(scores)

    def run(config: PerplexityConfig, docs: list[Document]) -> list:
        return PerplexityFilter(config, reference_dir).filter_batch(docs)

    docs = [Document(text=t, id=str(i), metadata={"language": "en"}) for i, t in enumerate(texts)]
    verdicts = run(PerplexityConfig(max_perplexity=middle), docs)
    assert [v is True for v in verdicts] == [s <= middle for s in scores]
    assert {v[1] for v in verdicts if v is not True} == {"perplexity_above"}
    assert [d.metadata["perplexity"] for d in docs] == scores
    # The band is read off the validation paragraphs' percentiles, the one table the model carries.
    table = json.loads((reference_dir / REFERENCE_FILE).read_text())["val_percentiles"]
    band = run(PerplexityConfig(keep_percentiles=(10.0, 90.0)), docs)
    expected = [True if table[10] <= s <= table[90] else (False, "perplexity_below" if s < table[10]
                else "perplexity_above") for s in scores]
    assert [v if v is True else tuple(v) for v in band] == expected
    # Other languages and empty texts pass unscored.
    german = Document(text="Die Katze sitzt auf der Matte und schläft.", id="de", metadata={"language": "de"})
    empty = Document(text="", id="e", metadata={"language": "en"})
    assert run(PerplexityConfig(max_perplexity=1.5), [german, empty]) == [True, True]
    assert "perplexity" not in german.metadata and "perplexity" not in empty.metadata


def mixed_texts() -> list[str]:
    """Documents of every length the filter meets: wikitext paragraphs (one or two windows), the same shuffled,
    menus and footers (a few dozen tokens), and paragraphs joined past max_tokens (eight windows, cut)."""
    wiki = wikitext(24)
    return wiki + shuffled(wiki) + boilerplate(24) + [" ".join(wiki[i:i + 6]) for i in range(0, 24, 6)]


@pytest.fixture(scope="module")
def alone(model) -> tuple[list[str], list[float], float]:
    """(texts, each text's perplexity scored by itself, a threshold that is one of the recorded scores): at that
    threshold the decision on the recorded (rounded) value keeps its document, whatever digits were rounded off."""
    texts = mixed_texts()
    scores = [model.perplexities([text])[0] for text in texts]
    return texts, scores, sorted(round(s, 2) for s in scores)[len(scores) // 2]


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 7, 64])
def test_a_documents_score_and_verdict_are_its_own_in_any_batch(reference_dir, alone, batch):
    texts, scores, threshold = alone
    docs = [Document(text=t, id=str(i), metadata={"language": "en"}) for i, t in enumerate(texts)]
    step = PerplexityFilter(PerplexityConfig(max_perplexity=threshold), reference_dir)
    verdicts = [v for i in range(0, len(docs), batch) for v in step.filter_batch(docs[i:i + batch])]
    assert [d.metadata["perplexity"] for d in docs] == [round(s, 2) for s in scores]
    assert [v is True for v in verdicts] == [round(s, 2) <= threshold for s in scores]
    assert 0 < sum(v is True for v in verdicts) < len(docs)


@pytest.mark.slow
def test_one_task_or_three_keep_the_same_documents_with_the_same_scores(reference_dir, alone, tmp_path):
    """The filter as a stage runs it (reader, step, writer; datatrove batches each task's stream 64 at a time), over
    three input parts as one task and as three."""
    texts, scores, threshold = alone
    inputs = tmp_path / "in"
    inputs.mkdir()
    for part in range(3):
        with gzip.open(inputs / f"part-{part:05d}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps({"id": str(i), "text": texts[i], "metadata": {"language": "en"}}) + "\n"
                         for i in range(part, len(texts), 3))
    config = FilterConfig(perplexity=PerplexityConfig(max_perplexity=threshold), pii=None)
    kept = {}
    for tasks in (1, 3):
        out = tmp_path / f"out-{tasks}"
        steps = filter_pipeline(config, input_dir=inputs, output_dir=out, lists_root=REPO / "recipes",
                                reference_dir=reference_dir)
        LocalRunner().run(steps, logging_dir=tmp_path / f"logs-{tasks}", tasks=tasks)
        kept[tasks] = {d["id"]: d["metadata"]["perplexity"] for p in sorted(out.glob("part-*.jsonl.gz"))
                       for d in iter_documents(p)}
    assert kept[1] == kept[3] == {str(i): round(s, 2) for i, s in enumerate(scores) if round(s, 2) <= threshold}


@pytest.mark.parametrize("kw, message", [
    (dict(), "needs max_perplexity or keep_percentiles"),
    (dict(max_perplexity=1.0), "max_perplexity must be above 1"),
    (dict(keep_percentiles=(50.0, 50.0)), "keep_percentiles must be"),
    (dict(keep_percentiles=(-1.0, 50.0)), "keep_percentiles must be"),
    (dict(max_perplexity=100.0, max_tokens=1), "max_tokens must be at least 2"),
    (dict(max_perplexity=100.0, languages=()), "languages must list"),
])
def test_bad_perplexity_settings_are_refused_by_name(kw, message):
    with pytest.raises(ValueError, match=message):
        PerplexityConfig(**kw)


def test_a_zip_is_read_as_its_members_in_order_and_paragraphs_are_its_lines_of_words():
    text = read_reference_text(SHARED_DATA / "misc" / "inaugural.zip")
    assert text.index("Fellow-Citizens of the Senate") < text.index("Fellow citizens, I am again called upon")
    assert reference_paragraphs("Title\n\nA line of five words here.\n  two words \n") == ["A line of five words here."]
