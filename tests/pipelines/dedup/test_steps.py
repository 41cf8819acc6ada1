"""The signature and bucket steps on real pages: input units, their files, and the same bytes for any task split."""

import gzip
import json
from pathlib import Path

import numpy as np
import orjson
import pytest

from pipelines.dedup.config import DedupConfig
from pipelines.dedup.minhash import MinHasher
from pipelines.dedup.stage import write_unit_index
from pipelines.dedup.steps import DedupBuckets, DedupSignatures, Shard, bucket_units, output_names, unit_file
from storage.local import LocalStore
from tests.pipelines.dedup.test_minhash import c4_docs, edit_words, write_part  # noqa: F401  (c4_docs: a fixture)


def test_a_shard_is_named_after_its_file_and_reads_its_documents(tmp_path, c4_docs):  # noqa: F811
    path = write_part(tmp_path / "web" / "part-00007.jsonl.gz", c4_docs[:3])
    shard = Shard("web", str(path))
    assert shard.stem == "00007"
    assert output_names(shard) == ("web/part-00007.jsonl.gz", "web/removed-00007.jsonl.gz")
    assert Shard("c4", "x/dump-3.jsonl").stem == "dump-3"
    assert [orjson.loads(line)["id"] for line in shard.lines()] == [d["id"] for d in c4_docs[:3]]
    # Plain JSON lines too, blank lines skipped; and the same file through the object store.
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(b"\n".join(orjson.dumps(d) for d in c4_docs[:2]) + b"\n\n")
    assert len(list(Shard("web", str(plain)).lines())) == 2
    store = LocalStore(tmp_path)
    assert list(Shard("web", "web/part-00007.jsonl.gz", store).lines()) == list(shard.lines())


def signature_files(work: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((work / "signatures").iterdir())}


@pytest.fixture
def units(tmp_path, c4_docs) -> list[Shard]:  # noqa: F811
    docs = [d for d in c4_docs if len(d["text"].split()) >= 150][:20]
    copy = {"text": edit_words(docs[4]["text"], edits=2, seed=4), "id": "copy-4", "metadata": {}}
    exact = {**docs[7], "id": "again-7"}
    parts = [docs[:7], docs[7:14] + [copy], [exact, {"text": "", "id": "empty", "metadata": {}}] + docs[14:]]
    return [Shard("web", str(write_part(tmp_path / "in" / f"part-{k:05d}.jsonl.gz", part))) for k, part in enumerate(parts)]


def test_signatures_are_written_per_unit_whatever_the_task_split(tmp_path, units):
    config = DedupConfig()
    DedupSignatures(units, config, tmp_path / "one").run(rank=0, world_size=1)
    for rank in range(2):  # two tasks: units 0, 2 and unit 1
        DedupSignatures(units, config, tmp_path / "two").run(rank=rank, world_size=2)
    assert signature_files(tmp_path / "one") == signature_files(tmp_path / "two")

    work = tmp_path / "one"
    assert json.loads(unit_file(work, "signatures", 2, ".json").read_text()) == {
        "source": "web", "shard": units[2].path, "documents": 8}
    bands = config.bands  # 8 documents in each of units 1 and 2
    sigs = np.fromfile(unit_file(work, "signatures", 1, ".sig"), dtype=np.uint32).reshape(8, bands * config.rows)
    keys = np.fromfile(unit_file(work, "signatures", 1, ".bands"), dtype=np.uint64).reshape(bands, 8)
    lines = np.fromfile(unit_file(work, "signatures", 1, ".band_lines"), dtype=np.uint32).reshape(bands, 8)
    # Each band sorted, its lines pointing back at the documents whose signatures give those keys.
    assert (np.diff(keys.astype(np.float64), axis=1) >= 0).all()
    assert np.array_equal(keys, MinHasher(config).band_keys(sigs)[lines, np.arange(bands)[:, None]])
    # The document without words has no signature, and band keys no other document can have.
    empty_keys = np.fromfile(unit_file(work, "signatures", 2, ".bands"), dtype=np.uint64).reshape(bands, 8)
    empty_lines = np.fromfile(unit_file(work, "signatures", 2, ".band_lines"), dtype=np.uint32).reshape(bands, 8)
    assert (empty_keys[empty_lines == 1] == np.uint64((1 << 63) | (2 << 32) | 1)).all()
    ids = [orjson.loads(line)[0] for line in unit_file(work, "signatures", 2, ".keys.jsonl").read_bytes().splitlines()]
    assert ids[:2] == ["again-7", "empty"]
    offsets = np.fromfile(unit_file(work, "signatures", 2, ".keys_index"), dtype=np.uint64)
    assert offsets[-1] == unit_file(work, "signatures", 2, ".keys.jsonl").stat().st_size and len(offsets) == 9


def test_buckets_find_the_copies_in_any_key_range_split(tmp_path, units):
    results = {}
    for partitions_of in (1 << 24, 6):  # one bucket per band, or 23 documents in 4 key ranges
        config = DedupConfig(bucket_docs=partitions_of)
        work = tmp_path / str(partitions_of)
        DedupSignatures(units, config, work).run()
        index = write_unit_index(units, config, work)
        buckets = bucket_units(config, index["partitions"])
        for rank in range(3):
            DedupBuckets(buckets, config, work).run(rank=rank, world_size=3)
        pairs = [np.load(work / "pairs" / f"{name}.npy") for name in buckets]
        exact = np.concatenate([p for name, p in zip(buckets, pairs) if name.startswith("exact")])
        near = np.concatenate([p for name, p in zip(buckets, pairs) if name.startswith("band")])
        results[partitions_of] = ({tuple(p) for p in exact.tolist()}, {tuple(p) for p in near.tolist()})
        assert len(buckets) == (1 + config.bands) * {1 << 24: 1, 6: 4}[partitions_of]  # exact hashes + bands
    assert results[1 << 24] == results[6]
    exact, near = results[6]
    # Global index = unit offset + line: docs[7] is unit 1 line 0 (7), again-7 unit 2 line 0 (15); the copy of
    # docs[4] (4) is unit 1 line 7 (14), found in the bands with docs[4] and with nothing else.
    assert exact == {(7, 15)}
    assert near == {(4, 14), (7, 15)}


def test_buckets_verify_candidates_with_the_signatures(tmp_path, units):
    config = DedupConfig(verify_threshold=1.0)  # only identical signatures pass
    DedupSignatures(units, config, tmp_path).run()
    write_unit_index(units, config, tmp_path)
    buckets = bucket_units(config, 1)
    DedupBuckets(buckets, config, tmp_path).run()
    near = np.concatenate([np.load(tmp_path / "pairs" / f"{name}.npy") for name in buckets if name.startswith("band")])
    assert {tuple(p) for p in near.tolist()} == {(7, 15)}  # the edited copy is refused


def test_a_phase_without_its_input_names_what_is_missing(tmp_path, units):
    with pytest.raises(FileNotFoundError, match="units.json is missing"):
        DedupBuckets(["exact-000"], DedupConfig(), tmp_path).run()
    with pytest.raises(FileNotFoundError, match="the signature phase did not write"):
        write_unit_index(units, DedupConfig(), tmp_path)


def test_gzip_inputs_decompress_as_they_stream(tmp_path, c4_docs):  # noqa: F811
    path = tmp_path / "part-00000.jsonl.gz"
    path.write_bytes(gzip.compress(b"".join(orjson.dumps(d) + b"\n" for d in c4_docs)))
    with Shard("web", str(path)).open() as f:
        assert f.readline() == orjson.dumps(c4_docs[0]) + b"\n"
