"""Offensive language on real text: insults written into real pages are dropped under their reason, wikitext's
paragraphs are kept, every judged document carries its scores, and bad settings are refused by name."""

import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest
from datatrove.data import Document

from pipelines.filters.config import FilterConfig, ToxicityConfig
from pipelines.filters.pipeline import filter_counts, filter_pipeline
from pipelines.filters.toxicity import ToxicityFilter, judge, split_sentences
from pipelines.runner import LocalRunner
from pipelines.shards import iter_documents

REPO = Path(__file__).resolve().parents[3]

# Written by hand for these tests: each scores >= 0.999 alone (the model gives 0.9999-1.0).
INSULTS = [
    "You are a fucking idiot and everyone hates you.",
    "Shut up, you stupid worthless piece of shit.",
    "Go to hell, you disgusting moron.",
]
# Milder ones, each between the sentence threshold (0.9) and max_score (0.999): only their share can drop a page.
MILD = ["This is the stupidest crap I have ever read.", "These people are morons."]


def wikitext_paragraphs(shared_data, min_words=20) -> list[str]:
    lines = (shared_data / "wiki" / "wikitext-2-valid.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if len(line.split()) >= min_words and not line.strip().startswith("=")]


def c4_pages(shared_data, n) -> list[str]:
    with gzip.open(shared_data / "jsonl" / "olmo_c4-sample.01.json.gz", "rt") as f:
        return [json.loads(line)["text"] for _, line in zip(range(n), f)]


def run_step(config: ToxicityConfig, texts: list[str], language="en") -> tuple[list[Document], dict[str, int]]:
    """(the kept documents, {drop reason: count}) from the step as datatrove runs it."""
    step = ToxicityFilter(config)
    docs = [Document(text=t, id=str(i), metadata={"language": language}) for i, t in enumerate(texts)]
    kept = list(step.run(iter(docs)))
    dropped = {key[len("dropped_"):]: int(stat.total) for key, stat in step.stats.stats.items()
               if key.startswith("dropped_")}
    return kept, dropped


def test_the_written_sentences_score_where_the_tests_need_them():
    from profanity_check import predict_prob

    assert min(predict_prob(INSULTS)) >= 0.999
    assert all(0.9 <= score < 0.999 for score in predict_prob(MILD))


def test_insults_written_into_real_pages_are_dropped_under_their_reason(shared_data):
    paragraphs = [p for p in wikitext_paragraphs(shared_data, min_words=80)][:6]
    pages = c4_pages(shared_data, 4)
    clean = paragraphs[:3] + pages[:2]
    # One insult in the middle of a long page is enough: its score reaches max_score.
    one_insult = [paragraphs[3] + "\n" + INSULTS[0] + "\n" + paragraphs[4], pages[2] + " " + INSULTS[1]]
    # Mild ones, a third of a short page's sentences: too many (toxicity_share), none alone too offensive.
    first = split_sentences(pages[3], 3)[:4]
    mild = [" ".join(first[:2] + MILD[:1] + first[2:4] + MILD[1:])]

    kept, dropped = run_step(ToxicityConfig(), clean + one_insult + mild)
    assert [d.text for d in kept] == clean
    assert dropped == {"toxicity_max": 2, "toxicity_share": 1}

    # With max_score off, the single insult in a long page is under the share and stays; the mild page still goes.
    kept, dropped = run_step(ToxicityConfig(max_score=None), clean + one_insult[:1] + mild)
    assert [d.text for d in kept] == clean + one_insult[:1]
    assert dropped == {"toxicity_share": 1}


def test_the_pipeline_counts_drops_and_writes_them_to_the_rejected_file(shared_data, tmp_path):
    pages = c4_pages(shared_data, 3)
    docs = [{"text": t, "id": f"c4-{i}", "metadata": {"language": "en"}} for i, t in enumerate(pages)]
    docs[1]["text"] += "\n" + INSULTS[2]
    inp, out, logs = tmp_path / "in", tmp_path / "out", tmp_path / "logs"
    inp.mkdir()
    with gzip.open(inp / "part-00000.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)
    config = FilterConfig(toxicity=ToxicityConfig(), pii=None)
    LocalRunner().run(filter_pipeline(config, input_dir=inp, output_dir=out, lists_root=REPO / "recipes"),
                      logging_dir=logs, tasks=1)
    counts = filter_counts(logs)
    assert (counts["in"], counts["kept"], counts["dropped"]) == (3, 2, {"toxicity_max": 1})
    rejected = list(iter_documents(out / "rejected-toxicity-part-00000.jsonl.gz"))
    assert [d["id"] for d in rejected] == ["c4-1"] and rejected[0]["metadata"]["filter_reason"] == "toxicity_max"


def test_wikitext_paragraphs_are_kept(shared_data):
    paragraphs = wikitext_paragraphs(shared_data)
    assert len(paragraphs) > 1500
    kept, dropped = run_step(ToxicityConfig(), paragraphs)
    assert len(kept) / len(paragraphs) >= 0.99, dropped  # measured: 1,645 of 1,647


def test_kept_documents_carry_their_scores_and_other_languages_pass_unscored(shared_data):
    paragraph = wikitext_paragraphs(shared_data, min_words=80)[0]
    kept, _ = run_step(ToxicityConfig(max_score=None, max_share=0.5), [paragraph, paragraph + "\n" + INSULTS[0]])
    clean, insulted = (d.metadata for d in kept)
    assert 0.0 <= clean["toxicity_max"] < 0.9 and clean["toxicity_share"] == 0.0
    n = len(split_sentences(paragraph, 3)) + 1
    assert insulted["toxicity_max"] >= 0.999 and insulted["toxicity_share"] == round(1 / n, 4)
    # German "die" is an English insult to the model: a German page is not judged by it.
    kept, dropped = run_step(ToxicityConfig(), ["Die Kinder wollen die Luft sauber halten, die Eltern auch."],
                             language="de")
    assert len(kept) == 1 and dropped == {} and "toxicity_max" not in kept[0].metadata


def test_sentences_split_at_punctuation_and_line_breaks_and_fragments_are_skipped():
    text = 'He said "Stop!" Then left. Home\nMenu item\nA line without a full stop ends here\nNo. 5 is 3.14 long.'
    assert split_sentences(text, 3) == ["He said \"Stop!\"", "A line without a full stop ends here"]
    assert split_sentences(text, 1)[-3:] == ["A line without a full stop ends here", "No.", "5 is 3.14 long."]
    assert judge([], ToxicityConfig()) == (True, 0.0, 0.0)


def test_the_model_scores_as_the_package_to_the_last_bit_without_scikit_learn(shared_data):
    """Our reading of alt-profanity-check's model gives its own predict_prob's scores exactly (the same float), on
    every sentence of the real C4, Dolma and DCLM documents and wikitext here (~28,000), the insults above, and edge
    cases: no known word, empty, upper case, non-ASCII. And a fresh process loads it with neither scikit-learn nor
    SciPy imported, which is what it is for."""
    from profanity_check import predict_prob

    from pipelines.filters.toxicity import _load_predict_prob

    texts = [json.loads(line)["text"] for path in sorted((shared_data / "jsonl").glob("*.gz"))
             for line in gzip.open(path, "rt")]
    texts += [json.loads(line)["text"] for line in open(shared_data / "quality" / "dclm_majority_data.jsonl")]
    texts.append((shared_data / "wiki" / "wikitext-2-valid.txt").read_text(encoding="utf-8"))
    sentences = [sentence for text in texts for sentence in split_sentences(text, 1)]
    sentences += INSULTS + MILD + ["", "zzqx", "FUCK THIS SHIT", "Straße, Ärger und Öl", "the the the"]
    assert len(sentences) > 25_000
    ours, theirs = _load_predict_prob()(sentences), predict_prob(sentences)
    assert [s for s, a, b in zip(sentences, ours, theirs) if a != float(b)] == []
    assert min(ours) < 0.001 and max(ours) > 0.9999  # both ends of the scale were compared

    probe = ("import sys; from pipelines.filters.toxicity import _load_predict_prob; "
             "p = _load_predict_prob()(['you idiot']); "
             "print(sorted(m for m in ('sklearn', 'scipy', 'profanity_check') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_model_is_loaded_in_the_worker_not_pickled():
    step = ToxicityFilter(ToxicityConfig())
    assert step._predict_prob is None
    assert len(pickle.dumps(step)) < 10_000


@pytest.mark.parametrize("bad, field", [
    ({"sentence_threshold": 1.5}, "sentence_threshold"),
    ({"max_share": -0.1}, "max_share"),
    ({"max_score": 0.0}, "max_score"),
    ({"min_sentence_words": 0}, "min_sentence_words"),
    ({"languages": ()}, "languages"),
])
def test_bad_settings_name_the_field(bad, field):
    with pytest.raises(ValueError, match=f"toxicity.{field}"):
        ToxicityConfig(**bad)


def test_the_step_is_off_by_default_and_a_misspelt_setting_is_refused():
    assert FilterConfig().toxicity is None
    adapter = pydantic.TypeAdapter(FilterConfig)
    assert adapter.validate_python({"toxicity": {}}).toxicity == ToxicityConfig()
    with pytest.raises(pydantic.ValidationError, match="max_scores"):
        adapter.validate_python({"toxicity": {"max_scores": 0.9}})
