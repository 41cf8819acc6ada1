"""Decontamination on real data: real benchmark items planted in real web pages (../shared/data)."""

import gzip
import json
from pathlib import Path

import numpy as np
import orjson
import pytest

from pipelines.decontam.config import DecontamConfig
from pipelines.decontam.index import BenchmarkIndex, Decontaminator, decontaminate, output_names
from pipelines.decontam.items import benchmark_texts
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
        ("hellaswag_val.jsonl.gz", 10042 * 6),
        ("mmlu_dev.jsonl.gz", 285 * 6),
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


def test_the_index_round_trips_and_counts_short_items(tmp_path, index):
    assert index.items["gsm8k_test"] == 1319 and index.short_items["gsm8k_test"] == 0
    index.save(tmp_path / "benchmarks.index")
    again = BenchmarkIndex.load(tmp_path / "benchmarks.index")
    assert again.names == index.names and again.ngram == 13 and again.item_ids == index.item_ids
    assert (again.items, again.short_items) == (index.items, index.short_items)
    for name in ("hashes", "owners", "item_of", "prefilter"):
        saved, loaded = getattr(index, name), getattr(again, name)
        assert loaded.dtype == saved.dtype and (loaded == saved).all(), name
        # Mapped from the file, not copied: the processes of a machine share the page cache's one copy.
        assert not loaded.flags.owndata and not loaded.flags.writeable, name
    assert again.matches(index.hashes[:100])[0].tolist() == list(range(100))
    (tmp_path / "old.npz").write_bytes(b"PK\x03\x04" + bytes(60))  # an index of format 3 was a numpy zip
    with pytest.raises(ValueError, match=r"old\.npz: not a decontamination index of format 4.*build it again"):
        BenchmarkIndex.load(tmp_path / "old.npz")
    mmlu = BenchmarkIndex.build([BENCH / "mmlu_dev.jsonl.gz"], 13)
    assert mmlu.short_items["mmlu_dev"] > 0  # a one-line question with a one-word answer has no 13-gram


def test_the_prefilter_finds_exactly_what_a_set_of_the_index_finds(tmp_path, index, pages):
    """matches() looks hashes up only where the prefilter's bit is set: on real pages, with benchmark text planted,
    and on n-grams whose top bits collide with benchmark ones but whose hash is not in it, it finds what plain set
    membership finds, with the owners that set says. Saved and loaded, the prefilter is the same."""
    hasher = WordHasher()
    # hash -> its benchmarks, in C: the dict keeps a hash's last (sorted: adjacent) entry, `also` the others
    last = dict(zip(index.hashes.tolist(), index.owners.tolist()))
    also: dict[int, set] = {}
    for i in np.flatnonzero(index.hashes[1:] == index.hashes[:-1]).tolist():
        also.setdefault(int(index.hashes[i]), set()).add(index.names[index.owners[i]])
    owners_of = _Owners(last, also, index.names)
    gsm8k = first_record(BENCH / "gsm8k_test.jsonl")["question"]
    texts = [p["text"] for p in pages[:40]] + [planted(pages[0], gsm8k, "x")["text"]]
    decoys = (index.hashes[:500] ^ np.uint64(1)).astype(np.uint64)  # same top bits, other hashes (almost all absent)
    for grams in [ngram_hashes(hasher(normalized_words(t)), 13) for t in texts] + [decoys, index.hashes[-50:]]:
        positions, names = index.matches(grams)
        expected = [i for i, h in enumerate(grams.tolist()) if h in owners_of]
        assert positions.tolist() == expected
        assert names == set().union(*(owners_of[grams[i]] for i in expected)) if expected else names == set()
    assert index.matches(ngram_hashes(hasher(normalized_words(texts[-1])), 13))[1] == {"gsm8k_test"}
    index.save(tmp_path / "benchmarks.index")
    assert (BenchmarkIndex.load(tmp_path / "benchmarks.index").prefilter == index.prefilter).all()


class _Owners:
    """`h in owners`, `owners[h]`: the names of the benchmarks whose n-grams have hash h."""

    def __init__(self, last: dict, also: dict, names: list[str]):
        self.last, self.also, self.names = last, also, names

    def __contains__(self, h) -> bool:
        return int(h) in self.last

    def __getitem__(self, h) -> set:
        return {self.names[self.last[int(h)]]} | self.also.get(int(h), set())


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


# Auditable hits: an MMLU item pasted the way web pages paste quizzes, inside a real paragraph of WikiText.
CEPHEID = 380  # mmlu_test line 380: a short question and short choices, no text of question + one choice has 13 words
PULSE = 128  # mmlu_test line 128: question + its answer has 16 words, the question alone 11


@pytest.fixture(scope="module")
def mmlu(tmp_path_factory) -> tuple[BenchmarkIndex, list[dict]]:
    """An index of mmlu_test's first 400 items (a file of those lines: the line numbers, the items' ids, are the
    real ones) and the items."""
    lines = gzip.open(BENCH / "mmlu_test.jsonl.gz").read().splitlines(keepends=True)[:400]
    path = tmp_path_factory.mktemp("bench") / "mmlu_test.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(lines), mtime=0))
    return BenchmarkIndex.build([path], 13), [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def paragraph() -> str:
    """A real paragraph: the first long one of WikiText-2's validation split."""
    with open(SHARED_DATA / "wiki" / "wikitext-2-valid.txt", encoding="utf-8") as f:
        return next(line.strip() for line in f if len(line) > 600)


def inside(paragraph: str, pasted: str) -> tuple[str, int]:
    """The paragraph with `pasted` after its second sentence, and where it starts."""
    sentences = paragraph.split(" . ")
    before = " . ".join(sentences[:2]) + " . "
    return before + pasted + " " + " . ".join(sentences[2:]), len(before)


def lettered(item: dict, start: int = 0) -> str:
    return " ".join(f"{'ABCD'[i]}. {c}" for i, c in enumerate(item["choices"]) if i >= start)


@pytest.mark.parametrize("paste", [
    lambda q: f"{q['question']} A. {q['choices'][0]} B. {q['choices'][1]} C. {q['choices'][2]} D. {q['choices'][3]}",
    lambda q: f"{q['question']}\n(A) {q['choices'][0]}\n(B) {q['choices'][1]}\n(C) {q['choices'][2]}\n(D) {q['choices'][3]}",
    lambda q: q["question"] + "\n" + "\n".join(q["choices"]),  # each choice on its own line
    lambda q: lettered(q, start=1),  # only a run across choices B to D, without the question
], ids=["lettered-inline", "lettered-lines", "plain-lines", "choices-only"])
def test_a_span_across_mmlu_choices_inside_real_text_is_found_and_names_the_item(mmlu, paragraph, paste):
    index, items = mmlu
    item = items[CEPHEID - 1]
    assert item["question"] == "Why are Cepheid stars relevant for astronomers?"
    # No text of the question with one choice has an n-gram: only the choices together can match.
    assert all(len(normalized_words(f"{item['question']} {c}")) < 13 for c in item["choices"])
    pasted = paste(item)
    text, at = inside(paragraph, pasted)
    assert Decontaminator(index).find(paragraph) == ([], set())  # the paragraph alone is clean
    spans, names, hits = Decontaminator(index).scan(text)
    assert names == {"mmlu_test"} and len(spans) == 1 and len(hits) == 1
    (hit,) = hits
    assert (hit.benchmark, hit.item) == ("mmlu_test", f"line={CEPHEID}")
    # The matched span is the pasted text (from its first to its last word), not the paragraph around it.
    assert (hit.start, hit.end) == spans[0] and at <= hit.start < at + 4 and hit.end == at + len(pasted.rstrip("."))
    assert item["choices"][2].rstrip(".") in text[hit.start:hit.end]


def test_a_single_choice_with_its_question_is_still_found(mmlu, paragraph):
    index, items = mmlu
    item = items[PULSE - 1]
    answer = item["choices"][item["answer"]]
    assert len(normalized_words(item["question"])) < 13 <= len(normalized_words(f"{item['question']} {answer}"))
    text, at = inside(paragraph, f"Quiz of the day: {item['question']} {answer}")
    _, _, hits = Decontaminator(index).scan(text)
    assert [(h.benchmark, h.item) for h in hits] == [("mmlu_test", f"line={PULSE}")]
    assert text[hits[0].start:hits[0].end] == f"{item['question']} {answer}".rstrip(".")


@pytest.mark.parametrize("action", ["drop", "cut"])
def test_every_hit_is_in_the_report_with_its_benchmark_item_and_matched_text(tmp_path, mmlu, paragraph, action):
    """A part with a clean paragraph, one with the lettered paste and one with question + answer: the report has
    one line per hit, naming the part, document, action, benchmark, item id and matched text; counts as before."""
    index, items = mmlu
    cepheid, pulse = items[CEPHEID - 1], items[PULSE - 1]
    quiz, _ = inside(paragraph, f"{cepheid['question']} {lettered(cepheid)}")
    answer, _ = inside(paragraph, f"{pulse['question']} {pulse['choices'][0]}")
    docs = [{"text": t, "id": i, "metadata": {}} for t, i in ((paragraph, "clean"), (quiz, "quiz"), (answer, "answer"))]
    stats = decontaminate(inputs=[write_part(tmp_path / "part-00002.jsonl.gz", docs)], index=index,
                          config=DecontamConfig(action=action), out_dir=tmp_path / "out")
    done = "dropped" if action == "drop" else "cut"
    assert [(r["part"], r["id"], r["action"], r["benchmark"], r["item"]) for r in stats.report] == [
        ("part-00002.jsonl.gz", "quiz", done, "mmlu_test", f"line={CEPHEID}"),
        ("part-00002.jsonl.gz", "answer", done, "mmlu_test", f"line={PULSE}")]
    first = stats.report[0]
    assert first["span"] == quiz[first["start"]:first["end"]] and "B. To measure galactic distances" in first["span"]
    assert first["span_chars"] == len(first["span"]) and first["ngrams"] >= 1
    assert stats.hits == {"mmlu_test": 2} and stats.documents_in == 3
    if action == "drop":
        assert (stats.kept, stats.dropped, stats.cut) == (1, 2, 0)
    else:
        assert (stats.kept, stats.dropped, stats.cut) == (3, 0, 2)
        kept = {d["id"]: d["text"] for d in iter_documents(tmp_path / "out" / "part-00002.jsonl.gz")}
        assert "galactic distances" not in kept["quiz"] and "Homarus gammarus" in kept["quiz"]


def test_long_matched_text_is_capped_in_the_report():
    from pipelines.decontam.index import REPORT_SPAN_CHARS, Hit, report_line

    text = "word " * 1000
    line = report_line("part-00000.jsonl.gz", {"id": "d"}, "dropped", text, Hit("b", "line=1", 5, 4005, 790))
    assert len(line["span"]) == REPORT_SPAN_CHARS and line["span_chars"] == 4000
