"""Decontamination on real data: real benchmark items planted in real web pages (../shared/data)."""

import gzip
import json
from pathlib import Path

import numpy as np
import orjson
import pytest

from pipelines.decontam.index import BenchmarkIndex, DecontamConfig, Decontaminator, benchmark_texts, decontaminate, output_names
from pipelines.dedup.minhash import WordHasher, ngram_hashes, normalized_words
from pipelines.shards import iter_documents
from tests.conftest import SHARED_DATA

BENCH = SHARED_DATA / "benchmarks"


def first_record(path: Path, skip: int = 0) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        for i, line in enumerate(f):
            if i == skip:
                return json.loads(line)


@pytest.fixture(scope="module")
def index() -> BenchmarkIndex:
    return BenchmarkIndex.build([BENCH / "gsm8k_test.jsonl", BENCH / "hellaswag_val.jsonl.gz", BENCH / "HumanEval.jsonl.gz"], 13)


@pytest.fixture(scope="module")
def pages() -> list[dict]:
    """Real C4 web pages in datatrove's format."""
    docs = [json.loads(line) for line in gzip.open(SHARED_DATA / "jsonl" / "olmo_c4_100_domains_theguardian.jsonl.gz")]
    return [{"text": d["text"], "id": f"page-{i}", "metadata": {"source": "web"}} for i, d in enumerate(docs)]


def write_part(path: Path, docs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as f:
        for doc in docs:
            f.write(orjson.dumps(doc) + b"\n")
    return path


def planted(page: dict, item_text: str, doc_id: str) -> dict:
    paragraphs = page["text"].split("\n")
    middle = len(paragraphs) // 2
    text = "\n".join(paragraphs[:middle] + [item_text] + paragraphs[middle:])
    return {**page, "text": text, "id": doc_id}


def test_a_planted_gsm8k_item_drops_its_page_and_clean_pages_survive_unchanged(tmp_path, index, pages):
    item = first_record(BENCH / "gsm8k_test.jsonl", skip=3)
    dirty = planted(pages[0], f"Homework help: {item['question']}", "dirty")
    docs = pages[1:] + [dirty]
    stats = decontaminate(inputs=[write_part(tmp_path / "part-00007.jsonl.gz", docs)], index=index,
                          config=DecontamConfig(), out_dir=tmp_path / "out")

    # Named after the input part.
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["part-00007.jsonl.gz", "removed-00007.jsonl.gz"]
    kept = list(iter_documents(tmp_path / "out" / "part-00007.jsonl.gz"))
    removed = list(iter_documents(tmp_path / "out" / "removed-00007.jsonl.gz"))
    assert kept == pages[1:]  # byte-for-byte the documents that went in
    assert [d["id"] for d in removed] == ["dirty"] and removed[0]["metadata"]["contaminated_by"] == ["gsm8k_test"]
    assert stats.hits == {"gsm8k_test": 1, "hellaswag_val": 0, "HumanEval": 0}
    assert (stats.documents_in, stats.kept, stats.dropped) == (len(docs), len(pages) - 1, 1)


def test_cut_removes_just_the_hellaswag_span(tmp_path, index, pages):
    item = first_record(BENCH / "hellaswag_val.jsonl.gz", skip=10)
    text = f"{item['ctx']} {item['endings'][int(item['label'])]}"
    dirty = planted(pages[2], text, "dirty")
    config = DecontamConfig(action="cut")
    stats = decontaminate(inputs=[write_part(tmp_path / "part-00000.jsonl.gz", [dirty])], index=index, config=config, out_dir=tmp_path / "out")

    (doc,) = iter_documents(tmp_path / "out" / "part-00000.jsonl.gz")
    assert item["ctx"] not in doc["text"]
    assert doc["metadata"]["contaminated_by"] == ["hellaswag_val"]
    assert doc["metadata"]["decontam_chars_cut"] >= len(text) - 10 and doc["metadata"]["decontam_spans_cut"] == 1
    # What remains is the page around it, and no benchmark n-gram is left in it.
    assert all(paragraph.strip() in doc["text"] for paragraph in pages[2]["text"].split("\n"))
    assert len(doc["text"]) <= len(pages[2]["text"]) + 3  # at most the item's final punctuation stays
    assert Decontaminator(index).find(doc["text"]) == ([], set())
    assert (stats.cut, stats.dropped, stats.spans_cut, stats.hits["hellaswag_val"]) == (1, 0, 1, 1)


def test_humaneval_code_in_a_page_is_found(index, pages):
    item = first_record(BENCH / "HumanEval.jsonl.gz", skip=5)
    spans, names = Decontaminator(index).find(pages[3]["text"] + "\n\n" + item["prompt"] + item["canonical_solution"])
    assert names == {"HumanEval"} and spans and spans[0][0] >= len(pages[3]["text"])


@pytest.mark.parametrize(
    "name, texts",
    [
        ("lambada_openai_test.jsonl", 5153),
        ("hellaswag_val.jsonl.gz", 10042 * 4),
        ("mmlu_dev.jsonl.gz", 285 * 4),
        ("arc_challenge_test.jsonl", None),
        ("piqa_val.jsonl", None),
        ("openbook_qa.jsonl", None),
        ("siqa.jsonl", None),
        ("commonsense_qa.jsonl", None),
        ("boolq_val.jsonl", None),
        ("winogrande_dev.jsonl", None),
        ("gsm8k_test.jsonl", 1319),
        ("math_test.jsonl", 5000),
        ("HumanEval.jsonl.gz", 164),
        ("wikitext-2-test.txt", None),
    ],
)
def test_every_shared_benchmark_layout_is_read(name, texts):
    found = list(benchmark_texts(BENCH / name))
    assert found and all(isinstance(t, str) and t.strip() for t in found)
    if texts is not None:
        assert len(found) == texts


def test_unknown_layouts_and_missing_files_are_named(tmp_path):
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"prompt_text": "x"}\n')
    with pytest.raises(ValueError, match="odd.jsonl.*unknown benchmark layout"):
        BenchmarkIndex.build([odd], 13)
    with pytest.raises(ValueError, match="does not exist"):
        BenchmarkIndex.build([tmp_path / "nope.jsonl"], 13)
    with pytest.raises(ValueError, match="decontamination.action"):
        DecontamConfig(action="hide")


def test_the_index_round_trips_and_counts_short_items(tmp_path, index):
    assert index.items["gsm8k_test"] == 1319 and index.short_items["gsm8k_test"] == 0
    index.save(tmp_path / "index.npz")
    again = BenchmarkIndex.load(tmp_path / "index.npz")
    assert again.names == index.names and (again.hashes == index.hashes).all() and again.ngram == 13
    mmlu = BenchmarkIndex.build([BENCH / "mmlu_dev.jsonl.gz"], 13)
    assert mmlu.short_items["mmlu_dev"] > 0  # a one-line question with a one-word answer has no 13-gram


def test_the_prefilter_finds_exactly_what_a_set_of_the_index_finds(tmp_path, index, pages):
    """matches() looks hashes up only where the prefilter's bit is set: on real pages, with benchmark text planted,
    and on n-grams whose top bits collide with benchmark ones but whose hash is not in it, it finds what plain set
    membership finds, with the owners that set says. Saved and loaded, the prefilter is the same."""
    hasher, owners_of = WordHasher(), {}
    for h, o in zip(index.hashes.tolist(), index.owners.tolist()):
        owners_of.setdefault(h, set()).add(index.names[o])
    gsm8k = first_record(BENCH / "gsm8k_test.jsonl")["question"]
    texts = [p["text"] for p in pages[:40]] + [planted(pages[0], gsm8k, "x")["text"]]
    decoys = (index.hashes[:500] ^ np.uint64(1)).astype(np.uint64)  # same top bits, other hashes (almost all absent)
    for grams in [ngram_hashes(hasher(normalized_words(t)), 13) for t in texts] + [decoys, index.hashes[-50:]]:
        positions, names = index.matches(grams)
        expected = [i for i, h in enumerate(grams.tolist()) if h in owners_of]
        assert positions.tolist() == expected
        assert names == set().union(*(owners_of[grams[i]] for i in expected)) if expected else names == set()
    assert index.matches(ngram_hashes(hasher(normalized_words(texts[-1])), 13))[1] == {"gsm8k_test"}
    index.save(tmp_path / "index.npz")
    assert (BenchmarkIndex.load(tmp_path / "index.npz").prefilter == index.prefilter).all()


def test_runs_of_numbers_are_not_contamination_but_math_problems_are():
    """MATH is full of number runs that any code has (the primes, 1..13); they are not indexed."""
    index = BenchmarkIndex.build([BENCH / "math_test.jsonl"], 13)
    checker = Decontaminator(index)
    primes = "PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61]"
    counting = "for i in [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]: print(i)"
    assert checker.find(primes) == ([], set()) and checker.find(counting) == ([], set())
    assert BenchmarkIndex.build([BENCH / "math_test.jsonl"], 13, min_letter_words=0).matches(
        ngram_hashes(WordHasher()(normalized_words(primes)), 13)
    )[1] == {"math_test"}  # without the rule, the primes would count as MATH leakage
    problem = first_record(BENCH / "math_test.jsonl", skip=2)["context"]
    assert checker.find(f"Forum post: can anyone help? {problem} Thanks!")[1] == {"math_test"}


def test_outputs_are_named_after_the_input_part():
    assert output_names("curation/deduplicated/v/web/part-00003.jsonl.gz") == ("part-00003.jsonl.gz", "removed-00003.jsonl.gz")
    assert output_names("part-00003-00001.jsonl.gz") == ("part-00003-00001.jsonl.gz", "removed-00003-00001.jsonl.gz")
