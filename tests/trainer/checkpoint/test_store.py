"""Checkpoint storage: atomic local commit, verification, retention, remote resume (the upload itself and
remote retention: test_uploader.py).

Against a local folder and a real S3 server (moto on loopback).
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from storage.s3 import S3Store
from trainer.checkpoint.store import (
    MANIFEST,
    CorruptCheckpoint,
    LocalCheckpoints,
    RemoteCheckpoints,
    find_resume,
)
from trainer.checkpoint.uploader import Uploader


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def header(step: int) -> dict:
    return {
        "tokens": step * 512, "world_size": 2, "global_batch": 8, "data_position": step * 8,
        "config": {"model": {"d_model": 64}}, "tokenizer_sha256": "ab" * 32,
        "lineage": [{"asset": "tokenization/packed", "data_version": "d1", "code_version": "c1", "run_id": "r1"}],
    }


def shard_files(step: int, size: int = 4096) -> dict[str, bytes]:
    """What two ranks would write: per-rank model/optimizer shards and RNG states (distinct per step)."""
    seed = hashlib.sha256(str(step).encode()).digest()
    blob = (seed * (size // len(seed) + 1))[:size]
    return {
        "ds/mp_rank_00_model_states.pt": b"model" + blob,
        "ds/zero_pp_rank_0_mp_rank_00_optim_states.pt": b"optim0" + blob[::-1],
        "ds/zero_pp_rank_1_mp_rank_00_optim_states.pt": b"optim1" + blob,
        "rng/rank-0.pkl": seed,
        "rng/rank-1.pkl": seed[::-1],
    }


def save(local: LocalCheckpoints, step: int, size: int = 4096) -> dict[str, bytes]:
    files = shard_files(step, size)
    staging = local.staging_dir(step)
    for rel, data in files.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_bytes(data)
    local.commit(step, header(step))
    return files


def read_tree(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- local -------------------------------------------------------------------------------------------


def test_commit_writes_manifest_renames_and_moves_latest(tmp_path):
    local = LocalCheckpoints(tmp_path / "ckpt")
    assert local.committed() == [] and local.latest() is None
    files = save(local, 12)

    folder = tmp_path / "ckpt" / "step-00000012"
    assert local.path(12) == folder and folder.is_dir()
    assert not (tmp_path / "ckpt" / "step-00000012.partial").exists()
    manifest = json.loads((folder / MANIFEST).read_text())
    for key, value in header(12).items():
        assert manifest[key] == value
    assert manifest["step"] == 12
    assert manifest["files"] == [
        {"path": rel, "bytes": len(files[rel]), "sha256": sha(files[rel])} for rel in sorted(files)]
    assert (tmp_path / "ckpt" / "latest").read_text() == "12\n" and local.latest() == 12
    assert local.committed() == [12]
    assert local.verify(12) == manifest
    assert read_tree(folder) == {**files, MANIFEST: (folder / MANIFEST).read_bytes()}

    save(local, 20)
    assert local.committed() == [12, 20] and local.latest() == 20
    point = find_resume(local, None)
    assert (point.step, point.path, point.source) == (20, local.path(20), "local")
    assert point.manifest["data_position"] == 160


def test_commit_refuses_bad_input(tmp_path):
    local = LocalCheckpoints(tmp_path)
    with pytest.raises(FileNotFoundError, match="step-00000003.*staging_dir"):
        local.commit(3, header(3))
    staging = local.staging_dir(3)
    with pytest.raises(ValueError, match="empty"):
        local.commit(3, header(3))
    (staging / "x.pt").write_bytes(b"x")
    with pytest.raises(ValueError, match="names step 4"):
        local.commit(3, {**header(3), "step": 4})
    with pytest.raises(ValueError, match="not JSON-serializable"):
        local.commit(3, {"config": object()})
    (staging / MANIFEST).write_text("{}")
    with pytest.raises(ValueError, match="reserved for the manifest"):
        local.commit(3, header(3))
    assert local.committed() == []


def test_partial_step_is_never_listed_nor_resumed(tmp_path):
    local = LocalCheckpoints(tmp_path)
    good = save(local, 4)
    # A crash mid-save: every rank wrote its files, but rank 0 never committed.
    staging = local.staging_dir(8)
    for rel, data in shard_files(8).items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_bytes(data)
    # A step folder without a manifest (copied by hand, say) is not committed either.
    (tmp_path / "step-00000009").mkdir()
    (tmp_path / "step-00000009" / "x.pt").write_bytes(b"x")

    assert local.committed() == [4] and local.partials() == [8] and local.latest() == 4
    point = find_resume(local, None, log=pytest.fail)
    assert point.step == 4 and read_tree(point.path) == {**good, MANIFEST: (point.path / MANIFEST).read_bytes()}

    # The partial is newer than every committed step: it may be the save in progress, so it stays...
    assert local.retain(keep_last=3) == [] and local.partials() == [8]
    # ...and a new save of that step starts from an empty folder, not the leftover.
    assert list(local.staging_dir(8).iterdir()) == []
    (local.staging_dir(8, fresh=False) / "only.pt").write_bytes(b"only")
    local.commit(8, header(8))
    assert read_tree(local.path(8)).keys() == {"only.pt", MANIFEST}
    # A partial older than the newest committed step is a crash's leftover: retention removes it.
    (local.staging_dir(6) / "x.pt").write_bytes(b"x")
    assert local.retain(keep_last=3) == [] and local.partials() == [] and local.committed() == [4, 8]
    (local.staging_dir(10) / "x.pt").write_bytes(b"x")
    local.retain(keep_last=3, all_partials=True)
    assert local.partials() == []


def test_saving_a_committed_step_again_replaces_it(tmp_path):
    local = LocalCheckpoints(tmp_path)
    save(local, 5)
    (local.staging_dir(5) / "new.pt").write_bytes(b"new")
    local.commit(5, header(5))
    assert local.committed() == [5] and read_tree(local.path(5)).keys() == {"new.pt", MANIFEST}
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["step-00000005"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing"])
def test_corrupt_step_is_reported_and_the_previous_one_used(tmp_path, damage):
    local = LocalCheckpoints(tmp_path)
    save(local, 8)
    save(local, 12)
    victim = local.path(12) / "ds" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
    elif damage == "truncate":
        victim.write_bytes(bytes(data[:-100]))
    else:
        victim.unlink()
    why = {"flip": "sha256 mismatch", "truncate": f"size {len(data) - 100} bytes, manifest says {len(data)}",
           "missing": "missing"}[damage]

    with pytest.raises(CorruptCheckpoint) as info:
        local.verify(12)
    assert str(info.value).startswith(
        f"checkpoint step-00000012 is corrupt: ds/zero_pp_rank_1_mp_rank_00_optim_states.pt: {why}")
    assert (info.value.step, info.value.file) == (12, "ds/zero_pp_rank_1_mp_rank_00_optim_states.pt")

    logged = []
    point = find_resume(local, None, log=logged.append)
    assert point.step == 8 and point.source == "local"
    assert len(logged) == 1 and logged[0].startswith("checkpoint step-00000012 is corrupt: ds/zero_pp_rank_1")
    assert logged[0].endswith("; using an older one")
    local.verify(8)


def test_corrupt_manifest_and_nothing_left(tmp_path):
    local = LocalCheckpoints(tmp_path)
    save(local, 3)
    (local.path(3) / MANIFEST).write_text('{"step": 3, "files": [')
    assert local.committed() == [3]
    logged = []
    assert local.newest_valid(logged.append) is None
    assert logged == [logged[0]] and "step-00000003 is corrupt: manifest.json: not valid JSON" in logged[0]
    assert logged[0].endswith("no older local checkpoint")


def test_local_retention_keeps_the_last_k_and_every_mth(tmp_path):
    local = LocalCheckpoints(tmp_path)
    for step in range(1, 10):
        save(local, step, size=64)
    assert local.retain(keep_last=2, keep_every=4, protect={5}) == [1, 2, 3, 6, 7]
    assert local.committed() == [4, 5, 8, 9]
    assert local.retain(keep_last=2, keep_every=4) == [5]
    assert local.committed() == [4, 8, 9]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000004", "step-00000008", "step-00000009"]
    for step in (4, 8, 9):
        local.verify(step)
    with pytest.raises(ValueError, match="keep_last"):
        local.retain(keep_last=0)


# --- remote (a local folder and S3) ------------------------------------------------------------------


def upload(store, local, steps, **kwargs):
    events = []
    uploader = Uploader(store, "checkpoints/main/run", on_event=events.append, **{"keep_last": 100, **kwargs})
    for step in steps:
        uploader.submit(step, local.path(step))
    assert uploader.flush(timeout=60)
    uploader.close()
    return events


def test_upload_then_resume_from_remote_after_the_local_folder_is_deleted(store, tmp_path):
    local = LocalCheckpoints(tmp_path / "ckpt")
    written = {step: save(local, step, size=300_000) for step in (2, 4, 6)}
    events = upload(store, local, [2, 4, 6])
    assert [(e["event"], e["step"]) for e in events] == [("uploaded", 2), ("uploaded", 4), ("uploaded", 6)]
    assert events[0]["bytes"] == sum(map(len, written[2].values())) + (local.path(2) / MANIFEST).stat().st_size

    remote = RemoteCheckpoints(store, "checkpoints/main/run")
    assert remote.committed() == [2, 4, 6] and remote.latest() == 6
    assert store.get_bytes(f"checkpoints/main/run/step-00000006/{MANIFEST}") == (local.path(6) / MANIFEST).read_bytes()
    manifest6 = local.verify(6)

    shutil.rmtree(tmp_path / "ckpt")
    fresh = LocalCheckpoints(tmp_path / "ckpt")
    point = find_resume(fresh, remote, log=pytest.fail)
    assert (point.step, point.source, point.path) == (6, "remote", fresh.path(6))
    assert read_tree(point.path) == {**written[6], MANIFEST: (point.path / MANIFEST).read_bytes()}
    assert point.manifest["files"] == manifest6["files"] and point.manifest["tokens"] == 6 * 512
    # Downloaded and committed locally: the next resume is local.
    assert fresh.committed() == [6] and fresh.partials() == [] and fresh.latest() == 6
    assert find_resume(fresh, remote).source == "local"


@pytest.mark.parametrize("damage", ["replaced", "bit_rot"])
def test_corrupt_remote_step_falls_back_to_an_older_one(store, tmp_path, damage):
    local = LocalCheckpoints(tmp_path / "ckpt")
    older = save(local, 1)
    newer = save(local, 2)
    upload(store, local, [1, 2])
    key = "checkpoints/main/run/step-00000002/rng/rank-1.pkl"
    if damage == "replaced":
        # Rewritten behind the uploader's back (S3 then records a matching sha256: only the manifest can tell).
        store.put_bytes(key, b"tampered")
        why = "rng/rank-1.pkl: size 8 bytes, manifest says 32"
    else:
        flipped = bytes([newer["rng/rank-1.pkl"][0] ^ 1]) + newer["rng/rank-1.pkl"][1:]
        if isinstance(store, S3Store):  # the object changes, its recorded sha256 does not
            import boto3

            boto3.session.Session().client("s3").put_object(
                Bucket=store.bucket, Key=f"{store.prefix}/{key}", Body=flipped,
                Metadata={"sha256": sha(newer["rng/rank-1.pkl"])})
            why = "rng/rank-1.pkl: S3 download of"
        else:
            (tmp_path / "store" / key).write_bytes(flipped)
            why = "rng/rank-1.pkl: sha256 mismatch"
    shutil.rmtree(tmp_path / "ckpt")

    logged = []
    fresh = LocalCheckpoints(tmp_path / "ckpt")
    point = find_resume(fresh, RemoteCheckpoints(store, "checkpoints/main/run"), log=logged.append)
    assert point.step == 1 and point.source == "remote"
    assert read_tree(point.path) == {**older, MANIFEST: (point.path / MANIFEST).read_bytes()}
    assert len(logged) == 1 and logged[0].startswith(f"checkpoint remote step-00000002 is corrupt: {why}")
    assert logged[0].endswith("; using an older one")
    assert fresh.committed() == [1] and fresh.partials() == []  # the bad download left nothing behind
