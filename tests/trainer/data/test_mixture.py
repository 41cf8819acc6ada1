"""The packed-shard reader and the mixture sampler, on real packed documents (math, books, code), each source
packed in several shards (as the packing tasks write them) and read as one stream: the same sequences as the
same documents packed in one shard; start-up reads a few sampled blocks per file, not the data."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

import storage.manifest as storage_manifest
from pipelines.tokenization.packed_format import build_index, shard_files, write_index
from pipelines.tokenization.config import PackingConfig, TokenizerConfig
from pipelines.tokenization.tokenizer import adopt_tokenizer, pack_documents
from storage.manifest import commit_folder
from storage.factory import open_store
from trainer.data.mixture import BLEND_BLOCK, DataConfig, MixtureDataset, NoDocuments, PackedSource, blend_index, rank_indices

DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
EOS = 50256


def real_documents() -> dict[str, list[dict]]:
    math = [json.loads(line) for line in (DATA / "math" / "gsm8k_train.jsonl").read_text().splitlines()[:1500]]
    books = (DATA / "books" / "tinyshakespeare.txt").read_text().split("\n\n")[:3000]
    with tarfile.open(DATA / "code" / "thealgorithms_python_py_files.tar.gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".py")][:300]
        code = [tar.extractfile(m).read().decode("utf-8", errors="replace") for m in members]
    return {
        "math": [{"id": f"math/{i}", "text": f"{d['question']}\n\n{d['answer']}"} for i, d in enumerate(math)],
        "books": [{"id": f"books/{i}", "text": t} for i, t in enumerate(books) if t.strip()],
        "code": [{"id": f"code/{i}", "text": t} for i, t in enumerate(code) if t.strip()],
    }


PARTS = 3  # shards per source in the `shards` fixture


def pack_source(store, root, name: str, docs: list[dict], parts: int) -> str:
    """The documents packed in `parts` shards (in order) and indexed, committed as the packed asset does."""
    tokenizer = adopt_tokenizer(DATA / "tokenizers" / "gpt2" / "tokenizer.json", TokenizerConfig())
    work = root / "work" / f"{name}-{parts}"
    size = -(-len(docs) // parts)
    names = [f"part-{i:05d}" for i in range(parts)]
    for i, shard in enumerate(names):
        pack_documents(docs[i * size:(i + 1) * size], tokenizer, eos_id=EOS, out_dir=work,
                       config=PackingConfig(val_fraction=0.05), shard=shard)
    index = build_index(work, names, dtype="uint16", eos_id=EOS, vocab_size=tokenizer.get_vocab_size(with_added_tokens=True))
    write_index(work, index)
    commit_folder(store, f"{name}-{parts}", work, {"asset": f"tokenization/{name}/packed", "packing": index})
    return str(root / "store" / f"{name}-{parts}")


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict[int, dict[str, str]]:
    """{shards per source: {source: committed packed folder}}: the same documents in 1 and in PARTS shards."""
    root = tmp_path_factory.mktemp("packed")
    store = open_store(root / "store")
    docs = real_documents()
    return {parts: {name: pack_source(store, root, name, source_docs, parts) for name, source_docs in docs.items()}
            for parts in (1, PARTS)}


@pytest.fixture(scope="module")
def shards(packed) -> dict[str, str]:
    return packed[PARTS]


def stream_of(source: PackedSource) -> np.ndarray:
    return np.concatenate([np.asarray(t, dtype=np.int64) for t in source._shard_tokens])


def config(shards, **overrides) -> DataConfig:
    settings = dict(shards=shards, weights={"math": 0.6, "books": 0.3, "code": 0.1}, seq_len=128, seed=0)
    return DataConfig(**{**settings, **overrides})


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_windows_of_two_lengths_cover_the_same_tokens(shards):
    source = PackedSource("books", shards["books"], "train")
    assert len(source._shard_tokens) == PARTS
    stream = stream_of(source)
    covered = {}
    for seq_len in (64, 100):
        count = source.windows(seq_len) + 5  # one whole pass and into the next: the stream repeats
        windows = [source.sequence(i, seq_len)[0] for i in range(count)]
        for a, b in zip(windows, windows[1:]):
            assert a[-1] == b[0]  # consecutive windows share one token: the last target is the next input
        covered[seq_len] = np.concatenate([w[:-1] for w in windows])
        assert np.array_equal(covered[seq_len], np.resize(stream, count * seq_len))
    shortest = min(len(c) for c in covered.values())
    assert shortest > source.tokens and np.array_equal(covered[64][:shortest], covered[100][:shortest])


def test_document_ids_and_positions_follow_the_offsets_across_the_wrap(shards):
    source = PackedSource("math", shards["math"], "train")
    offsets = np.concatenate([[0], np.cumsum(source.document_lengths())])
    seq_len = 256
    last = source.windows(seq_len) - 1  # wraps from the end of the stream into its start
    for i in (0, 7, last, last + 3):
        tokens, doc_ids, positions = source.sequence(i, seq_len)
        assert tokens.shape == doc_ids.shape == positions.shape == (seq_len + 1,)
        absolute = i * seq_len + np.arange(seq_len + 1)
        epoch, where = np.divmod(absolute, source.tokens)
        doc = np.searchsorted(offsets, where, side="right") - 1
        assert np.array_equal(doc_ids, epoch * source.documents + doc)
        assert np.array_equal(positions, where - offsets[doc])
        # A new document starts (position 0) exactly after an EOS.
        starts = np.flatnonzero(positions[1:] == 0) + 1
        assert np.array_equal(starts, np.flatnonzero(tokens[:-1] == EOS) + 1)
        assert np.all(np.diff(doc_ids) >= 0)
    _, doc_ids, _ = source.sequence(last, seq_len)
    assert doc_ids[0] == source.documents - 1 and doc_ids[-1] >= source.documents  # past the wrap: new ids


def test_realized_proportions_over_100000_samples_are_within_1_percent(shards):
    data = MixtureDataset(config(shards))
    chosen = np.array([data.locate(i)[0] for i in range(100_000)])
    realized = np.bincount(chosen, minlength=3) / len(chosen)
    for j, name in enumerate(data.names):
        assert abs(realized[j] - data.config.weights[name]) < 0.01 * data.config.weights[name], (name, realized[j])
    assert data.draws(100_000) == {name: int(np.sum(chosen == j)) for j, name in enumerate(data.names)}
    # The blend index itself is Megatron's: every prefix stays within one sample of its target share.
    source, _ = blend_index(np.array([0.6, 0.3, 0.1]), 1000)
    counts = np.cumsum(np.eye(3)[source], axis=0)
    assert np.all(np.abs(counts - np.outer(np.arange(1, 1001), [0.6, 0.3, 0.1])) <= 1.0)


def assert_batches_equal(a: dict, b: dict):
    assert a["indices"] == b["indices"] and a["sources"] == b["sources"]
    for key in ("tokens", "doc_ids", "positions"):
        assert a[key].dtype == np.int64 and np.array_equal(a[key], b[key])


def test_the_same_samples_on_1_2_or_4_ranks(shards):
    global_batch, steps = 8, 4
    k = BLEND_BLOCK - 13  # across a blend-block boundary
    single = MixtureDataset(config(shards))
    expected = single.batch(list(range(k, k + global_batch * steps)))
    for world_size in (1, 2, 4):
        ranks = [MixtureDataset(config(shards)) for _ in range(world_size)]  # one dataset per process
        rows = {key: [] for key in ("tokens", "doc_ids", "positions", "sources", "indices")}
        for step in range(steps):
            for rank, data in enumerate(ranks):
                batch = data.batch(rank_indices(k + step * global_batch, global_batch, rank, world_size))
                assert batch["tokens"].shape == (global_batch // world_size, 129)
                for key in rows:
                    rows[key].append(batch[key])
        joined = {key: np.concatenate(rows[key]) for key in ("tokens", "doc_ids", "positions")}
        joined["sources"] = [s for part in rows["sources"] for s in part]
        joined["indices"] = [i for part in rows["indices"] for i in part]
        assert_batches_equal(joined, expected)
    with pytest.raises(ValueError, match="multiple of world_size"):
        rank_indices(0, 6, 0, 4)


def test_a_small_source_repeats_every_window_once_per_pass_and_counts_epochs(shards):
    data = MixtureDataset(config(shards, weights={"math": 0.2, "books": 0.2, "code": 0.6}, seq_len=512))
    j = data.names.index("math")
    n = data.sources[j].windows(512)
    draws = []
    index = 0
    while len(draws) < 2 * n:
        source, window = data.locate(index)
        if source == j:
            draws.append(window)
        index += 1
    assert sorted(draws[:n]) == list(range(n)) and sorted(draws[n:]) == list(range(n, 2 * n))
    assert draws[:n] != list(range(n))  # shuffled within the pass
    epochs = data.epochs(index)
    assert epochs["math"] == pytest.approx(2 * n * 512 / data.sources[j].tokens) and epochs["math"] >= 2
    assert set(epochs) == {"math", "books", "code"} and all(e > 0 for e in epochs.values())
    # The seed reorders windows, never the mixture.
    other = MixtureDataset(config(shards, weights={"math": 0.2, "books": 0.2, "code": 0.6}, seq_len=512, seed=1))
    assert [other.locate(i)[0] for i in range(500)] == [data.locate(i)[0] for i in range(500)]
    assert [other.locate(i) for i in range(500)] != [data.locate(i) for i in range(500)]


def test_val_split_reads_the_held_out_documents(shards):
    data = MixtureDataset(config(shards, split="val"))
    for source in data.sources:
        manifest = json.loads((Path(source.folder) / "manifest.json").read_text())
        assert source.tokens == manifest["packing"]["splits"]["val"]["tokens"] > 0
    assert data.batch([0, 1, 2])["tokens"].shape == (3, 129)
    assert data.vocab_size == 50258 and int(data.batch(list(range(50)))["tokens"].max()) < data.vocab_size


def test_bad_input_is_refused_naming_the_source(shards, tmp_path):
    with pytest.raises(ValueError, match="'books'.*weight"):
        config(shards, weights={"math": 1.0, "books": -0.5, "code": 0.1})
    with pytest.raises(ValueError, match="sum to zero"):
        config(shards, weights={"math": 0.0, "books": 0.0, "code": 0.0})
    with pytest.raises(ValueError, match="'wiki' has a weight but no shards"):
        config(shards, weights={"math": 1.0, "books": 1.0, "code": 1.0, "wiki": 1.0})

    # A source with no tokens: a split with no documents.
    store = open_store(tmp_path / "store")
    work = tmp_path / "empty-work"
    stats = pack_documents([], adopt_tokenizer(DATA / "tokenizers" / "gpt2" / "tokenizer.json", TokenizerConfig()),
                           eos_id=EOS, out_dir=work, config=PackingConfig())
    commit_folder(store, "empty", work, {"packing": stats.manifest_section()})
    with pytest.raises(ValueError, match="source 'empty'.*no tokens"):
        MixtureDataset(config({**shards, "empty": str(tmp_path / "store" / "empty")},
                              weights={"math": 1.0, "books": 1.0, "code": 1.0, "empty": 0.5}))

    # A shard whose bytes no longer match its index (a small file: its sampled hash covers all of it).
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(shards["code"], damaged)
    tokens_file = damaged / "train" / "part-00001.tokens.bin"
    blob = bytearray(tokens_file.read_bytes())
    blob[100] ^= 0xFF
    tokens_file.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="source 'code'.*sha256"):
        MixtureDataset(config({**shards, "code": str(damaged)}))
    MixtureDataset(config({**shards, "code": str(damaged)}, verify=False))  # opt-out reads it as it is
    with open(tokens_file, "ab") as f:  # a size the index does not record: refused even without the hash
        f.write(b"\0\0")
    with pytest.raises(ValueError, match="source 'code'.*part-00001.tokens.bin has .* bytes"):
        MixtureDataset(config({**shards, "code": str(damaged)}, verify=False))


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_the_trainer_learns_from_packed_shards_and_reports_each_domain(shards, tmp_path):
    """The whole path the training stages take: packed outputs -> mixture -> Trainer, per-domain val loss."""
    import os

    from trainer.config import RunConfig, from_dict
    from trainer.train import Trainer

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    cfg = from_dict(RunConfig, {
        "data": {"shards": shards, "weights": {"math": 0.6, "books": 0.3, "code": 0.1}},
        "train_tokens": 12 * 8 * 64, "output_dir": str(tmp_path / "out"),
        "model": {"vocab_size": 50304, "d_model": 64, "n_layers": 1, "n_heads": 2},
        "optim": {"lr": 1e-2}, "schedule": {"kind": "constant"},
        "batch": {"global_batch": 8, "micro_batch": 4, "seq_len": 64},
        "metrics": {"log_interval": 4, "eval_batches": 1, "tensorboard": False},
    })
    trainer = Trainer(cfg)
    before = trainer.evaluate()
    summary = trainer.fit()
    assert summary["steps"] == 12 and summary["sample_index"] == 96 and not summary["skipped"]
    assert set(summary["val_loss"]) == {"math", "books", "code"}
    # Every domain's held-out loss falls from the untrained ~ln(50257) = 10.8.
    for name, loss in summary["val_loss"].items():
        assert loss < before[name] - 1.0, (name, before[name], loss)
    # The samples the trainer consumed are the mixture's, in order: its state is the global sample index.
    assert trainer.train_source.batch(list(range(4)))["tokens"].shape == (4, 65)


def test_a_long_context_stage_reads_only_long_documents(shards):
    """min_doc_tokens: windows come from documents at least that long; a source without one is left out."""
    lengths = {name: PackedSource(name, folder, "train").document_lengths() for name, folder in shards.items()}
    threshold = int(np.percentile(lengths["code"], 90))
    assert lengths["math"].max() < threshold  # GSM8K problems are short: math has none that long
    data = MixtureDataset(config(shards, seq_len=256, min_doc_tokens=threshold))
    assert (data.left_out, data.names) == (["books", "math"], ["code"])  # short problems, short speeches
    for name, source in zip(data.names, data.sources):
        kept = source.document_lengths()
        assert (kept >= threshold).all() and len(kept) == int((lengths[name] >= threshold).sum())
        assert source.document(0).tolist() == PackedSource(name, shards[name], "train").document(
            int(np.flatnonzero(lengths[name] >= threshold)[0])).tolist()
    batch = data.batch(list(range(64)))
    assert set(batch["sources"]) <= set(data.names)
    with pytest.raises(ValueError, match="min_doc_tokens"):
        MixtureDataset(config(shards, weights={"math": 1.0, "books": 0.0, "code": 0.0}, min_doc_tokens=threshold))


def test_several_shards_read_as_the_same_sequences_as_one(packed):
    """A source packed in PARTS shards yields exactly the windows, document ids and positions of the same documents
    packed in one: the sequences do not depend on how the packing was split."""
    for split, seq_len in (("train", 128), ("val", 64)):
        one = MixtureDataset(config(packed[1], split=split, seq_len=seq_len))
        many = MixtureDataset(config(packed[PARTS], split=split, seq_len=seq_len))
        assert [s.tokens for s in one.sources] == [s.tokens for s in many.sources]
        indices = list(range(0, 300)) + list(range(BLEND_BLOCK - 50, BLEND_BLOCK + 50))
        assert_batches_equal(many.batch(indices), one.batch(indices))
    for name in packed[1]:
        a, b = PackedSource(name, packed[1][name], "train"), PackedSource(name, packed[PARTS][name], "train")
        for d in (0, a.documents // 2, a.documents - 1):
            assert np.array_equal(a.document(d), b.document(d))
        # Every window of a pass, including those across a shard boundary and the wrap.
        for i in range(a.windows(200) + 2):
            for x, y in zip(a.sequence(i, 200), b.sequence(i, 200)):
                assert np.array_equal(x, y), (name, i)
    long_one = MixtureDataset(config(packed[1], seq_len=256, min_doc_tokens=300))
    long_many = MixtureDataset(config(packed[PARTS], seq_len=256, min_doc_tokens=300))
    assert long_one.names == long_many.names
    assert_batches_equal(long_many.batch(list(range(200))), long_one.batch(list(range(200))))


def big_source(root, tokens: int) -> str:
    """A synthetic packed output with one train shard of `tokens` tokens (documents of 1,000 tokens)."""
    work = root / "work"
    tokens_file, offsets_file = shard_files("train", "part-00000")
    (work / "train").mkdir(parents=True)
    stream = (np.arange(tokens) % 1000).astype(np.uint16)
    stream[999::1000] = EOS
    stream.tofile(work / tokens_file)
    np.arange(0, tokens + 1, 1000, dtype=np.int64).tofile(work / offsets_file)
    index = build_index(work, ["part-00000"], dtype="uint16", eos_id=EOS, vocab_size=50258)
    commit_folder(open_store(root / "store"), "big", work, {"packing": index})
    return str(root / "store" / "big")


def test_start_up_hashes_a_bounded_amount_whatever_the_shard_size(tmp_path, monkeypatch):
    """The check at open reads a few sampled blocks per file (3 MiB at most), not the 16 MB of tokens; a changed
    byte outside those blocks is the store's to catch (it verifies the full sha256 when it fetches a file)."""
    folder = big_source(tmp_path, 8_000_000)  # 16 MB of uint16 tokens, 64 KB of offsets
    hashed = []
    real_sha256 = hashlib.sha256

    class CountingSha256:
        def __init__(self, data=b""):
            self.inner = real_sha256(data)

        def update(self, data):
            hashed.append(len(data))
            self.inner.update(data)

        def hexdigest(self):
            return self.inner.hexdigest()

    monkeypatch.setattr(storage_manifest.hashlib, "sha256", CountingSha256)
    source = PackedSource("big", folder, "train")
    monkeypatch.undo()
    tokens_bytes = (Path(folder) / "train" / "part-00000.tokens.bin").stat().st_size
    assert tokens_bytes == 16_000_000 and sum(hashed) <= 3 * storage_manifest.SAMPLE_BLOCK_BYTES + 64_008 + 100
    assert source.tokens == 8_000_000 and source.documents == 8_000
    # The long-context filter over the mapped shard: the kept documents' positions, the tokens read in place.
    long = PackedSource("big", folder, "train", min_doc_tokens=1000)
    assert long.documents == source.documents and isinstance(long._shard_tokens[0], np.memmap)
    assert long._kept_starts.nbytes + long._kept_offsets.nbytes < 20 * long.documents  # two int64 per document
    tokens, doc_ids, positions = long.sequence(3, 700)
    assert np.array_equal(tokens, np.asarray(source.sequence(3, 700)[0])) and positions[0] == 2100 % 1000
    with pytest.raises(NoDocuments, match=r"no document of the train split has 1001 tokens or more \(the longest has 1000\)"):
        PackedSource("big", folder, "train", min_doc_tokens=1001)
