"""trainer.checkpoint.uploader: the background upload (in order, retried through an outage, never a partial step
remotely) and remote retention, against a local folder and a real S3 server (moto on loopback); the
outage test cuts the network with a TCP relay in front of the server while the uploader is mid-step.
"""

from __future__ import annotations

import json
import shutil
import threading

import pytest
from storage.local import LocalStore
from storage.objects import StoreError
from storage.s3 import S3Store
from tests.trainer.checkpoint.test_store import header, save, shard_files, upload
from trainer.checkpoint.store import MANIFEST, CorruptCheckpoint, LocalCheckpoints, RemoteCheckpoints, step_name
from trainer.checkpoint.uploader import Uploader, retain_remote


def test_remote_retention_keeps_the_last_k_and_every_mth(store, tmp_path):
    local = LocalCheckpoints(tmp_path / "ckpt")
    for step in range(1, 10):
        save(local, step, size=64)
    events = upload(store, local, range(1, 10), keep_last=2, keep_every=4)
    assert sorted(e["step"] for e in events if e["event"] == "deleted") == [1, 2, 3, 5, 6, 7]
    remote = RemoteCheckpoints(store, "checkpoints/main/run")
    assert remote.committed() == [4, 8, 9] and remote.latest() == 9
    steps_with_objects = {key.split("/")[3] for key in store.list("checkpoints/main/run") if key.count("/") > 3}
    assert steps_with_objects == {"step-00000004", "step-00000008", "step-00000009"}

    # An upload cut off before its manifest, older than the newest committed step: removed as an orphan.
    store.put_bytes("checkpoints/main/run/step-00000007/ds/x.pt", b"x")
    assert retain_remote(store, "checkpoints/main/run", keep_last=2, keep_every=4) == []
    assert not store.exists("checkpoints/main/run/step-00000007/ds/x.pt")


def test_remote_deletion_removes_the_manifest_first(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "store")
    local = LocalCheckpoints(tmp_path / "ckpt")
    for step in (1, 2):
        save(local, step, size=64)
    upload(store, local, [1, 2])
    deleted = []
    monkeypatch.setattr(store, "delete", lambda key: (deleted.append(key), LocalStore.delete(store, key)))
    retain_remote(store, "checkpoints/main/run", keep_last=1)
    assert deleted[0] == "checkpoints/main/run/step-00000001/manifest.json" and len(deleted) == 6


def test_uploader_rejects_submit_after_close_and_protects_pending_steps(tmp_path):
    store = LocalStore(tmp_path / "store")
    local = LocalCheckpoints(tmp_path / "ckpt")
    save(local, 1)
    gate = threading.Event()
    put_file = store.put_file
    store.put_file = lambda key, path: (gate.wait(30), put_file(key, path))[1]
    uploader = Uploader(store, "ck", keep_last=1)
    uploader.submit(1, local.path(1))
    save(local, 2)
    save(local, 3)
    # Step 1 is still waiting for the network: local retention must not delete it.
    assert uploader.pending() == {1}
    assert local.retain(keep_last=1, protect=uploader.pending()) == [2]
    gate.set()
    uploader.close(timeout=30)
    assert uploader.pending() == set() and uploader.uploaded == [1]
    with pytest.raises(RuntimeError, match="closed"):
        uploader.submit(3, local.path(3))


def test_step_removed_locally_before_upload_is_skipped(tmp_path):
    store = LocalStore(tmp_path / "store")
    local = LocalCheckpoints(tmp_path / "ckpt")
    save(local, 1)
    save(local, 2)
    shutil.rmtree(local.path(1))
    events = upload(store, local, [1, 2], retry_base_s=0.01)
    assert [(e["event"], e["step"]) for e in events] == [("upload_skipped", 1), ("uploaded", 2)]
    assert RemoteCheckpoints(store, "checkpoints/main/run").committed() == [2]


def test_commit_in_the_upload_thread(tmp_path):
    store = LocalStore(tmp_path / "store")
    local = LocalCheckpoints(tmp_path / "ckpt")
    events = []
    uploader = Uploader(store, "ck", keep_last=5, on_event=events.append)
    local.staging_dir(1)  # nothing written: the commit fails, is reported, and the next step still goes
    files = shard_files(2)
    staging = local.staging_dir(2)
    for rel, data in files.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_bytes(data)
    uploader.commit_and_submit(local, 1, header(1))
    uploader.commit_and_submit(local, 2, header(2))
    with pytest.raises(FileNotFoundError, match="step-00000003"):
        uploader.commit_and_submit(local, 3, header(3))
    assert uploader.flush(30)
    uploader.close()
    assert [(e["event"], e["step"]) for e in events] == [("commit_failed", 1), ("committed", 2), ("uploaded", 2)]
    assert "empty" in events[0]["error"] and uploader.failed == [1]
    assert local.committed() == [2] and local.partials() == [1] and local.latest() == 2
    assert local.verify(2)["tokens"] == 2 * 512
    assert RemoteCheckpoints(store, "ck").committed() == [2]
    assert store.get_bytes(f"ck/step-00000002/{MANIFEST}") == (local.path(2) / MANIFEST).read_bytes()


# --- S3 outage ---------------------------------------------------------------------------------------


def test_s3_outage_mid_upload_is_retried_and_never_shows_a_partial_step(s3, s3_proxy, tmp_path):
    # The uploader talks through the relay; the watcher talks to the server directly, so it sees
    # exactly what a resuming job would see while the relay is down.
    store = S3Store(f"s3://{s3.bucket}/p", endpoint_url=s3_proxy.url, max_attempts=1, connect_timeout=1)
    watcher = RemoteCheckpoints(S3Store(f"s3://{s3.bucket}/p"), "ck")
    local = LocalCheckpoints(tmp_path / "ckpt")
    written = {step: save(local, step, size=200_000) for step in range(1, 5)}

    events, retried = [], threading.Event()
    uploader = Uploader(store, "ck", keep_last=10, retry_base_s=0.05, retry_max_s=0.4,
                        on_event=lambda e: (events.append(e), e["event"] == "upload_retry" and e["attempt"] >= 3
                                            and retried.set()))
    # Cut the network right after the second file of step 2 reached the server.
    puts = []
    put_file = store.put_file

    def put_then_cut(key, path):
        info = put_file(key, path)
        puts.append(key)
        if len(puts) == 7:  # step 1 is 5 files; step 2's 2nd file
            s3_proxy.down()
        return info

    store.put_file = put_then_cut

    seen: list[list[int]] = []
    problems: list[str] = []

    def check_committed_are_complete():
        try:
            steps = watcher.committed()
        except StoreError:
            return
        seen.append(steps)
        for step in steps:
            try:
                manifest = watcher.manifest(step)
                for entry in manifest["files"]:
                    if not watcher.store.exists(watcher.key(step, entry["path"])):
                        problems.append(f"{step_name(step)} listed as committed without {entry['path']}")
            except (CorruptCheckpoint, StoreError) as exc:  # deleted meanwhile by retention: not here (keep 10)
                problems.append(f"{step_name(step)}: {exc}")

    for step in range(1, 5):
        uploader.submit(step, local.path(step))
    # submit() returned before anything was uploaded: everything is still pending.
    assert uploader.pending() <= {1, 2, 3, 4} and 4 in uploader.pending()

    assert retried.wait(30), events
    for _ in range(5):  # the network is down: step 2 is half there, and never listed
        check_committed_are_complete()
    assert seen[-1] == [1] and not problems
    assert any(key.startswith("p/ck/step-00000002/") for key in _server_keys(s3))
    assert uploader.pending() == {2, 3, 4}

    s3_proxy.up()
    stop = threading.Event()
    def poll():
        while not stop.wait(0.02):
            check_committed_are_complete()

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        assert uploader.flush(timeout=60), events
    finally:
        stop.set()
        poller.join()
    uploader.close()

    assert not problems, problems
    assert all(steps == list(range(1, len(steps) + 1)) for steps in seen)  # committed in order, never a gap
    retries = [e for e in events if e["event"] == "upload_retry"]
    assert retries and {e["step"] for e in retries} == {2} and [e["attempt"] for e in retries] == list(
        range(1, len(retries) + 1))
    assert all("error" in e and e["delay"] <= 0.4 for e in retries)
    assert [e["step"] for e in events if e["event"] == "uploaded"] == [1, 2, 3, 4]
    assert watcher.committed() == [1, 2, 3, 4] and watcher.latest() == 4
    for step, files in written.items():  # every object's bytes, straight from the server
        for rel, data in files.items():
            assert watcher.store.get_bytes(watcher.key(step, rel)) == data
        assert json.loads(watcher.store.get_bytes(watcher.key(step)))["files"] == local.verify(step)["files"]


def _server_keys(s3) -> list[str]:
    response = s3.client().list_objects_v2(Bucket=s3.bucket)
    return [obj["Key"] for obj in response.get("Contents", [])]
