"""trainer.checkpoint.rank_upload: checkpoints without a shared filesystem. Fast tests of the parts (per-rank uploads confirmed
through a real torch.distributed store, the manifest only after every rank's files, fetching a rank's files back,
verified) against a local folder and a real S3 server; then two torchrun "nodes" on loopback whose local folders
are distinct, with S3 (moto) the only place they share: a rank's upload cut off commits nothing, and a resume in two
new empty folders continues bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from torch.distributed import HashStore

from storage.local import LocalStore
from storage.factory import open_store
from tests.conftest import REPO
from tests.ports import free_port
from tests.trainer.conftest import read_metrics, run_dict
from tests.trainer.checkpoint.test_checkpointer import _kill_tree, _losses, _records
from tests.trainer.checkpoint.test_store import header, shard_files
from tests.trainer.test_multinode import cpu_env
from trainer.checkpoint.store import MANIFEST, CorruptCheckpoint, LocalCheckpoints, RemoteCheckpoints, step_name
from trainer.checkpoint.config import CheckpointConfig
from trainer.config import RunConfig, from_dict
from trainer.checkpoint.rank_upload import (Confirmations, RankUploader, expand_local_dir, fetch, find_committed, needed,
                                 rank_dir)

PREFIX = "checkpoints/main/run"


def rank_files(step: int, rank: int) -> dict[str, bytes]:
    """What rank `rank` of two writes under ZeRO-1: rank 0 also the model states and DeepSpeed's shared files."""
    files = shard_files(step)
    optim = f"ds/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
    own = {optim: files[optim], f"rank-{rank:05d}.pt": files[f"rng/rank-{rank}.pkl"]}
    if rank == 0:
        own |= {"ds/mp_rank_00_model_states.pt": files["ds/mp_rank_00_model_states.pt"], "trainer.json": b"{}",
                "ds/zero_to_fp32.py": b"# script"}
    return own


def write_part(local: LocalCheckpoints, step: int, rank: int) -> dict[str, bytes]:
    files = rank_files(step, rank)
    staging = local.staging_dir(step)
    for rel, data in files.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_bytes(data)
    return files


class Ranks:
    """Two ranks' uploaders in this process, their confirmations through one real torch.distributed store."""

    def __init__(self, store, root: Path, **kwargs):
        self.events: list[dict] = []
        kv = HashStore()
        self.locals = [LocalCheckpoints(rank_dir(root / f"node{r}", r)) for r in (0, 1)]
        self.uploaders = [RankUploader(store, PREFIX, rank=r, confirm=Confirmations(kv, "t", 2), local=self.locals[r],
                                       on_event=self.events.append, **{"keep_last": 10, "retry_base_s": 0.01, **kwargs})
                          for r in (0, 1)]

    def save(self, step: int, ranks=(0, 1)) -> None:
        for r in ranks:
            write_part(self.locals[r], step, r)
            self.uploaders[r].commit_and_submit(self.locals[r], step, {**header(step), "step": step, "rank": r})

    def close(self) -> None:
        for u in self.uploaders:
            assert u.flush(timeout=60)
            u.close()


def test_the_manifest_waits_for_every_ranks_upload_and_lists_all_their_files(store, tmp_path):
    gate = threading.Event()
    put_file = store.put_file
    held = []

    def slow_for_rank_1(key, path):  # rank 1's network is slow: its files arrive late
        if "rank_1" in key or "rank-00001" in key:
            held.append(key)
            assert gate.wait(30)
        return put_file(key, path)

    store.put_file = slow_for_rank_1
    ranks = Ranks(store, tmp_path)
    ranks.save(3)
    remote = RemoteCheckpoints(store, PREFIX)
    deadline = time.monotonic() + 30
    while not store.exists(remote.key(3, "ds/mp_rank_00_model_states.pt")) or not held:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.2)
    # Rank 0's files are in the store, rank 1's are not: the step is not committed.
    assert remote.committed() == [] and not store.exists(remote.key(3)) and remote.latest() is None
    gate.set()
    ranks.close()
    assert remote.committed() == [3] and remote.latest() == 3
    manifest = remote.manifest(3)
    expected = {**rank_files(3, 0), **rank_files(3, 1)}
    assert [f["path"] for f in manifest["files"]] == sorted(expected)
    assert {f["path"]: f["rank"] for f in manifest["files"]}["rank-00001.pt"] == 1
    assert manifest["data_position"] == 24 and "rank" not in manifest
    # Each rank's local folder holds its own files only, committed there with a manifest of them.
    assert [f["path"] for f in ranks.locals[1].verify(3)["files"]] == sorted(rank_files(3, 1))
    events = [(e["event"], e["step"]) for e in ranks.events if e["event"] in ("uploaded", "not_committed")]
    assert events == [("uploaded", 3)]


def test_a_rank_that_could_not_write_or_upload_leaves_the_step_uncommitted(tmp_path):
    store = LocalStore(tmp_path / "store")
    ranks = Ranks(store, tmp_path, keep_last=2)
    ranks.save(3)
    ranks.save(6, ranks=(0,))
    ranks.uploaders[1].submit_failed(6, "OSError: No space left on device")
    ranks.save(9)
    ranks.save(12)
    ranks.close()
    remote = RemoteCheckpoints(store, PREFIX)
    assert remote.committed() == [9, 12]  # remote retention (keep_last 2) on rank 0; step 6 never committed
    (refused,) = [e for e in ranks.events if e["event"] == "not_committed"]
    assert refused == {"event": "not_committed", "step": 6, "reasons": {1: "OSError: No space left on device"}}
    assert not [k for k in store.list(PREFIX) if step_name(6) in k or step_name(3) in k]  # orphans and old steps
    assert ranks.locals[0].committed() == [9, 12] and ranks.locals[1].committed() == [9, 12]  # local retention


def test_rank_0_waits_for_a_confirmation_that_never_comes_and_still_leaves_when_the_run_stops(tmp_path):
    store = LocalStore(tmp_path / "store")
    ranks = Ranks(store, tmp_path)
    ranks.save(3, ranks=(0,))  # rank 1 never confirms step 3 (its network is down, or it died)
    first = ranks.uploaders[0]
    assert not first.flush(timeout=0.5) and first.pending() == {3}
    assert store.exists(RemoteCheckpoints(store, PREFIX).key(3, "trainer.json"))  # its own files are up
    start = time.monotonic()
    first.close(timeout=0)  # a run that failed: no collective to abandon, the thread leaves at once
    assert time.monotonic() - start < 2 and not first._thread.is_alive()
    assert RemoteCheckpoints(store, PREFIX).committed() == []
    assert {"event": "upload_abandoned", "steps": [3]} in ranks.events
    ranks.uploaders[1].close()


def test_a_rank_fetches_its_own_and_the_shared_files_verified_and_keeps_what_it_has(s3, tmp_path):
    store = open_store(f"s3://{s3.bucket}/ckpt")
    ranks = Ranks(store, tmp_path / "saved")
    ranks.save(3)
    ranks.close()
    remote = RemoteCheckpoints(store, PREFIX)
    manifest = remote.manifest(3)
    fresh = LocalCheckpoints(rank_dir(tmp_path / "new-node", 1))
    downloaded = fetch(remote, fresh, 3, manifest, rank=1)
    files = {p.relative_to(fresh.path(3)).as_posix() for p in fresh.path(3).rglob("*") if p.is_file()}
    assert files == {"ds/mp_rank_00_model_states.pt", "ds/zero_to_fp32.py", "trainer.json", "rank-00001.pt",
                     "ds/zero_pp_rank_1_mp_rank_00_optim_states.pt", MANIFEST}
    assert downloaded == sum(e["bytes"] for e in needed(manifest["files"], 1))
    assert fetch(remote, fresh, 3, manifest, rank=1) == 0  # all there and verified: nothing downloaded again
    everything = LocalCheckpoints(tmp_path / "all")  # a universal conversion reads every rank's shards
    assert fetch(remote, everything, 3, manifest, rank=0, everything=True) == sum(e["bytes"] for e in manifest["files"])
    # A damaged local copy is fetched again; a damaged object is named.
    (fresh.path(3) / "trainer.json").write_bytes(b"{ }")
    assert fetch(remote, fresh, 3, manifest, rank=1) == 2
    s3.client().put_object(Bucket=s3.bucket, Key=f"ckpt/{PREFIX}/step-00000003/rank-00001.pt", Body=b"torn")
    with pytest.raises(CorruptCheckpoint, match=r"remote step-00000003 is corrupt: rank-00001.pt"):
        fetch(remote, LocalCheckpoints(tmp_path / "other"), 3, manifest, rank=1)
    assert not LocalCheckpoints(tmp_path / "other").committed() and not LocalCheckpoints(tmp_path / "other").partials()


def test_resume_takes_the_newest_step_committed_in_the_store_past_a_corrupt_one(tmp_path):
    store = LocalStore(tmp_path / "store")
    ranks = Ranks(store, tmp_path / "saved")
    for step in (3, 6):
        ranks.save(step)
    ranks.save(9, ranks=(0,))  # rank 1 never confirms step 9: only rank 0's files are in the store
    ranks.uploaders[1].submit_failed(9, "killed")
    ranks.close()
    remote = RemoteCheckpoints(store, PREFIX)
    assert remote.committed() == [3, 6]
    store.put_bytes(remote.key(6, "trainer.json"), b"damaged")
    logged = []
    point = find_committed(remote, LocalCheckpoints(tmp_path / "fresh"), 0, 1, log=logged.append)
    assert (point.step, point.source, point.manifest["world_size"]) == (3, "remote", 2)
    assert "step-00000006 is corrupt: trainer.json" in logged[0] and "using an older one" in logged[0]
    again = find_committed(remote, LocalCheckpoints(tmp_path / "fresh"), 0, 1, log=logged.append, data_position=24)
    assert (again.step, again.source) == (3, "local")  # its files are here now, verified; and step 6 is past 24


def test_needed_leaves_out_only_the_other_ranks_own_files():
    entries = [{"path": p} for p in ("ds/mp_rank_00_model_states.pt", "ds/zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                     "ds/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "rank-00000.pt",
                                     "rank-00001.pt", "trainer.json", "ds/layer_01-model_states.pt")]
    assert [e["path"] for e in needed(entries, 1)] == [
        "ds/mp_rank_00_model_states.pt", "ds/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "rank-00001.pt",
        "trainer.json", "ds/layer_01-model_states.pt"]


def test_the_config_and_the_local_folder_of_each_node(monkeypatch):
    with pytest.raises(ValueError, match="checkpoint.shared_local_dir = false needs checkpoint.remote"):
        CheckpointConfig(shared_local_dir=False)
    assert CheckpointConfig().shared_local_dir is True  # today's layout unless asked
    monkeypatch.setenv("NODE_SCRATCH", "/scratch/node7")
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    assert expand_local_dir("$NODE_SCRATCH/ckpt") == "/scratch/node7/ckpt"
    with pytest.raises(ValueError, match=r"checkpoint.local_dir = '\${NOT_SET_HERE}/ckpt'.*NOT_SET_HERE is not set"):
        expand_local_dir("${NOT_SET_HERE}/ckpt")
    assert rank_dir("/scratch/node7/ckpt", 3) == Path("/scratch/node7/ckpt/rank-00003")


# --- two torchrun "nodes" on loopback, each with a local folder of its own ---------------------------------------

STEPS, EVERY = 12, 3
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def node_run(folder: Path, url: str, stage: int) -> Path:
    """A 12-step run saving every 3 steps; each node's checkpoints under $NODE_SCRATCH (its own disk, on a cluster)."""
    run = run_dict(folder / "out", train_tokens=STEPS * 8 * 64, deepspeed={"zero_stage": stage, "bf16": False},
                   metrics={"eval_batches": 0},
                   checkpoint={"interval_steps": EVERY, "keep_last": 2, "remote": url, "shared_local_dir": False,
                               "local_dir": "$NODE_SCRATCH/checkpoints", "upload_retry_max_s": 0.5})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text(json.dumps(run))
    return folder / "run.json"


def start_nodes(run_json: Path, scratch: list[Path], endpoint: str) -> list[subprocess.Popen]:
    """Two torchrun agents (--nnodes 2, one process each) meeting at a c10d rendezvous, as on two hosts."""
    meet = ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}", "--rdzv_id", "rank-upload"]
    procs = []
    for node in (0, 1):
        log = open(run_json.parent / f"node{node}.log", "ab")
        env = {**cpu_env(), "AWS_ENDPOINT_URL": endpoint, "NODE_SCRATCH": str(scratch[node])}
        procs.append(subprocess.Popen([TORCHRUN, "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(node),
                                       *meet, "-m", "trainer", "--config", str(run_json)], cwd=REPO, env=env,
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def finish_nodes(procs, run_json: Path) -> None:
    try:
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_tree(p)
    logs = [(run_json.parent / f"node{n}.log").read_text()[-3000:] for n in (0, 1)]
    assert codes == [0, 0], logs


def node_folder(scratch: Path) -> tuple[int, LocalCheckpoints]:
    """The one rank folder a node's local folder holds, and that rank."""
    (sub,) = list((scratch / "checkpoints").iterdir())
    return int(sub.name.removeprefix("rank-")), LocalCheckpoints(sub)


def final_weights(store, prefix: str, step: int) -> dict:
    """The step's full fp32 weights (every rank's shards fetched from the store, then DeepSpeed's zero_to_fp32)."""
    from trainer.checkpoint.weights import checkpoint_weights

    remote = RemoteCheckpoints(store, prefix)
    with tempfile.TemporaryDirectory() as tmp:
        local = LocalCheckpoints(tmp)
        fetch(remote, local, step, remote.manifest(step), 0, everything=True)
        return checkpoint_weights(local.path(step))[0]


@pytest.mark.slow  # three two-node runs of 12 steps and a one-rank resume: 35-100 s on 2 cores, per stage
@pytest.mark.parametrize("stage", [1, 3])  # ZeRO-3: each rank's model states are its own shard too
def test_two_nodes_without_a_shared_folder_commit_in_the_store_and_resume_on_new_nodes_bit_identical(
        tmp_path, s3, s3_proxy, stage):
    client, ckpt = s3.client(), "checkpoints/main/run"

    # 1. Uninterrupted: the reference. Each node's folder holds only its own rank's files; the store holds all.
    ref_json = node_run(tmp_path / "ref", f"s3://{s3.bucket}/ref", stage)
    ref_scratch = [tmp_path / "ref" / f"node{n}" for n in (0, 1)]
    finish_nodes(start_nodes(ref_json, ref_scratch, s3_proxy.url), ref_json)
    reference = _losses(read_metrics(ref_json.parent / "out"))
    assert sorted(reference) == list(range(1, STEPS + 1))
    ref_store = open_store(f"s3://{s3.bucket}/ref")
    remote = RemoteCheckpoints(ref_store, ckpt)
    assert remote.committed() == [9, 12] and remote.latest() == 12  # remote retention by rank 0: keep_last 2
    parts = dict(node_folder(scratch) for scratch in ref_scratch)
    assert sorted(parts) == [0, 1]  # one rank per node, whichever node the rendezvous made rank 0
    for rank, local in parts.items():
        assert local.committed() == [9, 12]  # local retention on each node
    own = {rank: {f["path"]: f["sha256"] for f in local.verify(12)["files"]} for rank, local in parts.items()}
    manifest = remote.manifest(12)
    of_rank_1 = {f["path"] for f in manifest["files"] if "_rank_1_" in f["path"] or f["path"] == "rank-00001.pt"}
    assert "ds/zero_pp_rank_1_mp_rank_00_optim_states.pt" in of_rank_1
    assert set(own[1]) == of_rank_1 and not set(own[0]) & of_rank_1  # rank 1's node: its files, only those
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == {**own[0], **own[1]}
    assert {f["rank"] for f in manifest["files"] if f["path"] in own[1]} == {1}
    assert manifest["world_size"] == 2 and manifest["data_position"] == STEPS * 8
    listed = client.list_objects_v2(Bucket=s3.bucket, Prefix=f"ref/{ckpt}/{step_name(12)}/")["Contents"]
    modified = {o["Key"].rsplit(f"{step_name(12)}/", 1)[1]: o["LastModified"] for o in listed}
    assert modified[MANIFEST] >= max(t for k, t in modified.items() if k != MANIFEST)

    # 2. Rank 1's upload of step 6 is cut off (the network resets each attempt): rank 0 uploaded its files of
    # step 6 and trains on, but never commits the step.
    url = f"s3://{s3.bucket}/run"
    run_json = node_run(tmp_path / "run", url, stage)
    out, remote = run_json.parent / "out", RemoteCheckpoints(open_store(url), ckpt)
    s3_proxy.block(b"/step-00000006/rank-00001.pt")
    procs = start_nodes(run_json, [tmp_path / "run" / f"first-node{n}" for n in (0, 1)], s3_proxy.url)
    try:
        deadline = time.monotonic() + 300
        while not (remote.store.exists(remote.key(6, "trainer.json")) and 9 in _losses(_records(out))):
            assert all(p.poll() is None for p in procs), "a node ended before the kill point"
            assert time.monotonic() < deadline, "the kill point never came"
            time.sleep(0.05)
        time.sleep(1.0)
        assert remote.committed() == [3] and remote.latest() == 3
        assert not remote.store.exists(remote.key(6))
        assert not remote.store.exists(remote.key(6, "rank-00001.pt"))
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_tree(p)
    s3_proxy.block(None)

    # 3. A resume on two new nodes, their folders empty: every rank fetches its files of step 3 from the store.
    fresh = [tmp_path / "run" / f"second-node{n}" for n in (0, 1)]
    finish_nodes(start_nodes(run_json, fresh, s3_proxy.url), run_json)
    records = _records(out)
    resumed = [i for i, r in enumerate(records) if r["event"] == "resumed"]
    assert [(records[i]["step"], records[i]["source"]) for i in resumed] == [(3, "remote")]
    after = _losses(records[resumed[0]:])
    assert sorted(after) == list(range(4, STEPS + 1))
    assert after == {s: reference[s] for s in range(4, STEPS + 1)}  # bit for bit
    final, expected = final_weights(remote.store, ckpt, STEPS), final_weights(ref_store, ckpt, STEPS)
    assert final.keys() == expected.keys() and all(torch.equal(final[k], expected[k]) for k in expected)
    assert remote.committed() == [9, 12] and not [k for k in remote.store.list(ckpt) if step_name(6) in k]

    # 4. One rank resumes the two-rank step 9 (a universal conversion): it fetches every rank's shards.
    from trainer.train import Trainer

    for key in [k for k in ref_store.list(ckpt) if step_name(9) in k]:
        client.copy_object(Bucket=s3.bucket, Key=f"one/{ckpt}/{key[len(ckpt) + 1:]}",
                           CopySource={"Bucket": s3.bucket, "Key": f"ref/{key}"})
    one = run_dict(tmp_path / "one" / "out", train_tokens=STEPS * 8 * 64, metrics={"eval_batches": 0},
                   deepspeed={"zero_stage": stage, "bf16": False},
                   checkpoint={"interval_steps": EVERY, "remote": f"s3://{s3.bucket}/one", "shared_local_dir": False,
                               "local_dir": str(tmp_path / "one" / "node")})
    losses = Trainer(from_dict(RunConfig, one)).fit()["losses"]
    (event,) = [r for r in read_metrics(tmp_path / "one" / "out") if r["event"] == "resumed"]
    assert (event["step"], event["source"], event["universal"]) == (9, "remote", True)
    assert losses == pytest.approx([reference[s] for s in (10, 11, 12)], abs=2e-3)  # 1 rank's reduction order


@pytest.mark.slow  # a DeepSpeed engine trained for 14 steps in this process
def test_the_guards_rollback_without_a_shared_folder_restores_a_step_committed_in_the_store(tmp_path):
    from tests.trainer.checkpoint.test_checkpointer import GarbageAt
    from trainer.train import Trainer, build_sources

    store = tmp_path / "store"
    cfg = from_dict(RunConfig, run_dict(
        tmp_path / "out", train_tokens=14 * 8 * 64, optim={"lr": 1e-2}, metrics={"eval_batches": 0},
        checkpoint={"interval_steps": 2, "keep_last": 10, "remote": str(store), "shared_local_dir": False,
                    "local_dir": str(tmp_path / "node")},
        guard={"warmup_steps": 4, "loss_ratio": 1.2, "max_strikes": 3, "strike_window": 5}))
    remote = RemoteCheckpoints(open_store(str(store)), PREFIX)
    seen = {}

    class Watched(GarbageAt):
        def batch(self, indices):
            if 80 in indices and not seen:  # the first step after the rollback (it skips samples 56-79)
                seen["committed"] = remote.committed()
            return super().batch(indices)

    train, val = build_sources(cfg)
    summary = Trainer(cfg, train_source=Watched(train, set(range(56, 80))), val_sources=val).fit()
    records = read_metrics(tmp_path / "out")
    (rollback,) = [r for r in records if r["event"] == "rollback"]
    # As with a shared folder (test_checkpoint): back to step 6, step 8 (its data past the spike's start) dropped.
    assert (rollback["to_step"], rollback["skip_window"], rollback["discarded_checkpoints"]) == (6, [56, 80], [8])
    assert summary["steps"] == 14 and summary["sample_index"] == 14 * 8 + 24
    # The store is where a resume looks: step 8 of the path rolled back left it at the rollback.
    assert seen["committed"] == [2, 4, 6]
    assert remote.committed() == [2, 4, 6, 8, 10, 12, 14]
    assert remote.manifest(6)["skip_windows"] == [] and remote.manifest(8)["skip_windows"] == [[56, 80]]
    assert LocalCheckpoints(rank_dir(tmp_path / "node", 0)).committed() == [2, 4, 6, 8, 10, 12, 14]
