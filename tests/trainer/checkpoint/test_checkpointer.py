"""Checkpoints that replay exactly: kill -9 and resume (ZeRO-1, ZeRO-3 on 2 ranks), 2 -> 1 ranks, resume
from the object store, a changed global batch, the spike guard's rollback (to a checkpoint, or to the initial
state before the first one), training through an S3 outage.

Tiny runs of 12 steps (global batch 8) saving every 3 steps; references are computed once per module.
Long because the module-scoped reference runs are shared by every resume case; split, each file would train them again.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from storage.factory import open_store
from tests.conftest import REPO
from tests.trainer.conftest import read_metrics, run_dict
from tests.trainer.faults import fault_env
from trainer.checkpoint.checkpointer import ResumeRefused, young_interval_steps
from trainer.checkpoint.store import LocalCheckpoints, RemoteCheckpoints, step_name
from trainer.config import RunConfig, from_dict

STEPS, EVERY = 12, 3
SAVES = list(range(EVERY, STEPS + 1, EVERY))  # 3, 6, 9, 12
TORCHRUN_2 = (os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nproc_per_node", "2",
              "-m", "trainer")


def _run(out, stage=1, checkpoint=None, **sections) -> dict:
    sections = {"train_tokens": STEPS * 8 * 64, "metrics": {"eval_batches": 0}, **sections}
    return run_dict(out, deepspeed={"zero_stage": stage},
                    checkpoint={"interval_steps": EVERY, "keep_last": 4, **(checkpoint or {})}, **sections)


def _write(folder: Path, run: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.json").write_text(json.dumps(run))
    return folder / "run.json"


def _records(out) -> list[dict]:
    """metrics.jsonl, tolerating a last line cut by a kill."""
    path = Path(out, "metrics.jsonl")
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            pass
    return records


def _losses(records) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records if r["event"] == "train"}


def _start(run_json: Path, env: dict | None = None) -> subprocess.Popen:
    log = open(run_json.parent / "log.txt", "ab")
    # A session of its own, so the kill takes torchrun and both ranks at once, as a node failure would.
    return subprocess.Popen([*TORCHRUN_2, "--config", str(run_json)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, **(env or {})})


def _finish(proc: subprocess.Popen, run_json: Path) -> None:
    rc = proc.wait(timeout=600)
    assert rc == 0, (run_json.parent / "log.txt").read_text()[-4000:]


def _kill_when(proc: subprocess.Popen, ready, timeout=300) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, "the run ended before the kill point"
        assert time.monotonic() < deadline, "the kill point never came"
        time.sleep(0.01)
    _kill_tree(proc)


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and its ranks, which torch's elastic agent starts in sessions of their own."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    for pid in map(int, children):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    for pid in map(int, children):  # wait until each rank is dead (gone, or a zombie)
        while _alive(pid):
            time.sleep(0.01)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.fixture(scope="module")
def two_rank_reference(tmp_path_factory):
    """Uninterrupted 2-rank runs (same checkpoint settings), one per ZeRO stage, made on first use."""
    made = {}

    def get(stage):
        if stage not in made:
            folder = tmp_path_factory.mktemp(f"ref-zero{stage}")
            run_json = _write(folder, _run(folder / "out", stage))
            _finish(_start(run_json), run_json)
            made[stage] = (folder / "out", _losses(read_metrics(folder / "out")))
        return made[stage]

    return get


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
@pytest.mark.parametrize("stage", [1, 3])
def test_kill_mid_step_then_mid_save_replays_bit_identical_losses(tmp_path, two_rank_reference, stage):
    _, reference = two_rank_reference(stage)
    assert sorted(reference) == list(range(1, STEPS + 1))
    rng = random.Random(stage)
    out = tmp_path / "out"
    run_json = _write(tmp_path, _run(out, stage))
    local = LocalCheckpoints(out / "checkpoints")

    # 1. Killed mid-step, at a random step after the first save. The save commits off the training thread: on busy
    # cores step 4 can be logged before step 3's commit, so the kill also waits for that commit to end, i.e. for
    # `latest` (its last act, after the rename that committed() sees: a kill between the two once left no `latest`).
    kill_step = rng.choice([4, 5])
    _kill_when(_start(run_json), lambda: kill_step in _losses(_records(out)) and local.latest() == 3)
    assert local.committed() == [3]

    # 2. Restarted, then killed mid-save: a rank's DeepSpeed shards are on disk, and every rank's writer thread
    # sleeps after its shards, before its RNG file, the trainer state and its done marker.
    save_step = rng.choice([6, 9])
    proc = _start(run_json, fault_env("save_delay:seconds=2"))
    _kill_when(proc, lambda: any(local.partial_path(save_step).glob("ds/*.pt")))
    before = [s for s in SAVES if s < save_step]
    assert local.committed() == before and local.latest() == before[-1]  # the partial step is never committed
    assert save_step in local.partials()

    # 3. Restarted again, to the end.
    _finish(_start(run_json), run_json)
    records = _records(out)
    resumed = [r for r in records if r["event"] == "resumed"]
    assert [(r["step"], r["source"], r["universal"]) for r in resumed] == [(3, "local", False),
                                                                            (before[-1], "local", False)]
    train = [r for r in records if r["event"] == "train"]
    # Every step logged, before the kills and after each resume, has the uninterrupted run's loss, bit for bit.
    assert {r["step"] for r in train} == set(reference)
    mismatch = [(r["step"], r["loss"], reference[r["step"]]) for r in train if r["loss"] != reference[r["step"]]]
    assert not mismatch
    assert local.committed() == SAVES and not local.partials()
    manifest = local.verify(STEPS)
    assert manifest["world_size"] == 2 and manifest["data_position"] == STEPS * 8 and manifest["global_batch"] == 8
    assert {f["path"] for f in manifest["files"]} >= {"trainer.json", "rank-00000.pt", "rank-00001.pt"}


def kill_mid_step_then_mid_save(tmp_path: Path, settings) -> LocalCheckpoints:
    """The kill -9 test above for another layout (a pipeline, tensor parallelism): `settings(out)` is a run of 12 steps
    saved every 3 on 2 ranks. Run once uninterrupted; then killed mid-step after the first save, then mid-save (a
    partial step never commits), then run to the end: every logged loss equals the uninterrupted run's bit for bit.
    Returns the interrupted run's checkpoints."""
    reference_json = _write(tmp_path / "ref", settings(tmp_path / "ref" / "out"))
    _finish(_start(reference_json), reference_json)
    reference = _losses(_records(tmp_path / "ref" / "out"))
    assert sorted(reference) == list(range(1, STEPS + 1))

    out = tmp_path / "run" / "out"
    run_json = _write(tmp_path / "run", settings(out))
    local = LocalCheckpoints(out / "checkpoints")
    _kill_when(_start(run_json), lambda: 5 in _losses(_records(out)) and local.latest() == 3)
    assert local.committed() == [3]
    proc = _start(run_json, fault_env("save_delay:seconds=2"))
    _kill_when(proc, lambda: any(local.partial_path(6).glob("ds/*.pt")))
    assert local.committed() == [3] and 6 in local.partials()
    _finish(_start(run_json), run_json)

    records = _records(out)
    assert [(r["step"], r["universal"]) for r in records if r["event"] == "resumed"] == [(3, False), (3, False)]
    train = [r for r in records if r["event"] == "train"]
    assert {r["step"] for r in train} == set(reference)
    assert [(r["step"], r["loss"]) for r in train if r["loss"] != reference[r["step"]]] == []
    assert local.committed() == SAVES and not local.partials()
    return local


def _trainer(out, **sections):
    from trainer.train import Trainer

    return Trainer(from_dict(RunConfig, _run(out, **sections)))


def _copy_step(src_root: Path, step: int, dest_root: Path) -> None:
    dest_root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src_root / step_name(step), dest_root / step_name(step))


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
@pytest.mark.parametrize("stage", [1, 3])
def test_resume_on_one_rank_from_two(tmp_path, two_rank_reference, stage):
    ref_out, reference = two_rank_reference(stage)
    _copy_step(ref_out / "checkpoints", 6, tmp_path / "out" / "checkpoints")
    trainer = _trainer(tmp_path / "out", stage=stage)
    assert trainer.state.step == 6 and trainer.state.sample_index == 48
    losses = trainer.fit()["losses"]
    resumed = [r for r in read_metrics(tmp_path / "out") if r["event"] == "resumed"]
    assert resumed[0]["world_size"] == 2 and resumed[0]["universal"] is True
    expected = [reference[s] for s in range(7, STEPS + 1)]
    # The first step sees the restored weights: only the order of the loss sum differs.
    assert losses[0] == pytest.approx(expected[0], abs=1e-5)
    # Then bf16 rounding of reduction-order differences (as 2 ranks vs 1 rank from scratch, test_train).
    assert max(abs(a - b) for a, b in zip(losses, expected)) < 2e-3, (losses, expected)
    assert len(losses) == len(expected)


@pytest.fixture(scope="module")
def one_rank_reference(tmp_path_factory):
    """An uninterrupted 1-rank run in this process, its checkpoints also copied to a local-path object store."""
    folder = tmp_path_factory.mktemp("ref-1rank")
    store = folder / "store"
    trainer = _trainer(folder / "out", checkpoint={"remote": str(store)})
    summary = trainer.fit()
    return folder / "out", store, dict(zip(range(1, STEPS + 1), summary["losses"]))


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_resume_from_the_object_store_after_the_local_folder_is_gone(tmp_path, one_rank_reference):
    ref_out, ref_store, reference = one_rank_reference
    prefix = "checkpoints/main/run"
    remote = RemoteCheckpoints(open_store(str(ref_store)), prefix)
    assert remote.committed() == SAVES
    # The remote copy as it stood after step 6 (no local folder at all).
    store = tmp_path / "store"
    shutil.copytree(ref_store / prefix / step_name(6), store / prefix / step_name(6))
    trainer = _trainer(tmp_path / "out", checkpoint={"remote": str(store)})
    assert not (tmp_path / "out" / "checkpoints" / step_name(3)).exists()
    losses = trainer.fit()["losses"]
    assert losses == [reference[s] for s in range(7, STEPS + 1)]
    resumed = [r for r in read_metrics(tmp_path / "out") if r["event"] == "resumed"]
    assert [(r["step"], r["source"]) for r in resumed] == [(6, "remote")]


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_a_changed_global_batch_is_refused_unless_allowed(tmp_path, one_rank_reference):
    ref_out, _, _ = one_rank_reference
    _copy_step(ref_out / "checkpoints", 9, tmp_path / "out" / "checkpoints")
    with pytest.raises(ResumeRefused, match=r"batch.global_batch = 8, this run has batch.global_batch = 16.*"
                                            r"checkpoint.allow_batch_change"):
        _trainer(tmp_path / "out", batch={"global_batch": 16})
    trainer = _trainer(tmp_path / "out", batch={"global_batch": 16}, checkpoint={"allow_batch_change": True})
    summary = trainer.fit()
    assert [h["batch"] for h in trainer.history] == [16, 16] and summary["sample_index"] == 9 * 8 + 32
    changes = [r for r in read_metrics(tmp_path / "out") if r["event"] == "batch_change"]
    assert changes == [{"event": "batch_change", "step": 9, "from": 8, "to": 16}]


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_a_corrupt_step_is_reported_and_the_one_before_used(tmp_path, one_rank_reference):
    ref_out, _, reference = one_rank_reference
    for step in (6, 9):
        _copy_step(ref_out / "checkpoints", step, tmp_path / "out" / "checkpoints")
    shard = tmp_path / "out" / "checkpoints" / step_name(9) / "rank-00000.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit pattern, same size: only the hash can tell
    shard.write_bytes(bytes(data))
    losses = _trainer(tmp_path / "out").fit()["losses"]
    assert losses == [reference[s] for s in range(7, STEPS + 1)]
    records = read_metrics(tmp_path / "out")
    (corrupt,) = [r for r in records if r["event"] == "corrupt_checkpoint"]
    assert step_name(9) in corrupt["message"] and "rank-00000.pt" in corrupt["message"]
    assert [r["step"] for r in records if r["event"] == "resumed"] == [6]


class GarbageAt:
    """The real text source, except that the given global samples are uniform noise; records what it served."""

    def __init__(self, source, garbage: set[int]):
        self.source, self.garbage, self.vocab_size = source, garbage, source.vocab_size
        self.served: list[int] = []

    def batch(self, indices):
        self.served += indices
        b = self.source.batch(indices)
        for row, i in enumerate(indices):
            if i in self.garbage:
                g = torch.Generator().manual_seed(i)
                b["tokens"][row] = torch.randint(0, self.vocab_size, b["tokens"][row].shape, generator=g)
        return b


def _spiky_run(tmp_path, *, every: int):
    """(config, train source, val sources) of a 14-step run at a high LR, checkpointing every `every` steps, whose
    guard asks for a rollback after three strikes within five steps."""
    from trainer.train import build_sources

    cfg = from_dict(RunConfig, _run(tmp_path / "out", train_tokens=14 * 8 * 64, optim={"lr": 1e-2},
                                    checkpoint={"interval_steps": every, "keep_last": 10},
                                    guard={"warmup_steps": 4, "loss_ratio": 1.2, "max_strikes": 3,
                                           "strike_window": 5}))
    return (cfg, *build_sources(cfg))


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_rollback_restores_the_checkpoint_before_the_spike_and_skips_the_window(tmp_path):
    from trainer.train import Trainer

    # Samples 56..79 are garbage: steps 7, 8 and 9 (0-based), three strikes within the window.
    garbage = set(range(56, 80))
    cfg, train, val = _spiky_run(tmp_path, every=2)
    source = GarbageAt(train, garbage)
    trainer = Trainer(cfg, train_source=source, val_sources=val)
    summary = trainer.fit()
    records = read_metrics(tmp_path / "out")
    assert [r["step"] for r in records if r["event"] == "skip"] == [7, 8, 9]
    (rollback,) = [r for r in records if r["event"] == "rollback"]
    # Back to the newest checkpoint whose data position (48) is before the window; step 8's (64) is not.
    assert rollback["skip_window"] == [56, 80] and rollback["to_step"] == 6 and rollback["step"] == 10
    assert rollback["discarded_checkpoints"] == [8]
    # After the rollback the data jump over the window, and the run still reaches its token budget.
    assert [h["samples"] for h in trainer.history if h["step"] >= 6][:2] == [[48, 56], [80, 88]]
    assert summary["steps"] == 14 and summary["sample_index"] == 14 * 8 + 24 and summary["skipped"] == []
    assert not [r for r in records[records.index(rollback):] if r["event"] == "skip"]
    local = LocalCheckpoints(tmp_path / "out" / "checkpoints")
    assert local.committed() == [2, 4, 6, 8, 10, 12, 14]
    assert local.manifest(6)["skip_windows"] == [] and local.manifest(8)["skip_windows"] == [[56, 80]]
    assert local.manifest(14)["skip_windows"] == [[56, 80]] and local.manifest(14)["data_position"] == 136

    # A resume from a checkpoint after the rollback skips the window too, and replays the same losses.
    for step in local.committed():
        if step != 10:
            shutil.rmtree(local.path(step))
    source2 = GarbageAt(train, garbage)
    resumed = Trainer(cfg, train_source=source2, val_sources=val)
    assert resumed.state.skip_windows == [[56, 80]] and resumed.state.sample_index == 10 * 8 + 24
    resumed.fit()
    assert not set(source2.served) & garbage
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in trainer.history if h["step"] >= 10]


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_a_spike_before_the_first_checkpoint_rolls_back_to_the_initial_state(tmp_path):
    from trainer.train import Trainer

    # Samples 56..79 are garbage: steps 7, 8 and 9 (0-based), three strikes before the first checkpoint (step 12).
    # (Earlier steps would not do: the loss is still near a uniform guess's there, so noise is no spike.)
    garbage = set(range(56, 80))
    cfg, train, val = _spiky_run(tmp_path, every=12)
    source = GarbageAt(train, garbage)
    trainer = Trainer(cfg, train_source=source, val_sources=val)
    summary = trainer.fit()
    records = read_metrics(tmp_path / "out")
    (rollback,) = [r for r in records if r["event"] == "rollback"]
    assert rollback["skip_window"] == [56, 80] and rollback["to_step"] == 0 and rollback["step"] == 10
    assert rollback["to"] == "initial state"
    # The initial state came back: the steps before the garbage replay the same losses (train records 1-6).
    before, after = records[:records.index(rollback)], records[records.index(rollback):]
    first = [(r["step"], r["loss"]) for r in before if r["event"] == "train" and r["step"] < 7]
    assert len(first) == 6 and [(r["step"], r["loss"]) for r in after if r["event"] == "train"][:6] == first
    assert [h["samples"] for h in trainer.history][6:8] == [[48, 56], [80, 88]]
    assert summary["steps"] == 14 and summary["sample_index"] == 14 * 8 + 24 and summary["skipped"] == []
    assert not [r for r in after if r["event"] == "skip"]
    local = LocalCheckpoints(tmp_path / "out" / "checkpoints")
    assert local.committed() == [12, 14] and local.manifest(12)["skip_windows"] == [[56, 80]]

    # Killed after the rollback and resumed from its first checkpoint: the window stays skipped, the losses replay.
    shutil.rmtree(local.path(14))
    source2 = GarbageAt(train, garbage)
    resumed = Trainer(cfg, train_source=source2, val_sources=val)
    assert resumed.state.skip_windows == [[56, 80]] and resumed.state.sample_index == 12 * 8 + 24
    resumed.fit()
    assert not set(source2.served) & garbage
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in trainer.history if h["step"] >= 12]


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_training_goes_on_while_the_object_store_is_unreachable(tmp_path, s3, s3_proxy, monkeypatch):
    from trainer.train import Trainer

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_proxy.url)
    url = f"s3://{s3.bucket}/pretrain"
    cfg = from_dict(RunConfig, _run(tmp_path / "out", checkpoint={"remote": url, "keep_last": 2, "resume": False,
                                                                  "upload_retry_max_s": 0.5}))
    local = LocalCheckpoints(tmp_path / "out" / "checkpoints")
    s3_proxy.down()
    seen = {}

    def bring_back():
        # Up again once training has finished and an upload has failed: every save happened while the
        # server was unreachable.
        while not ({"checkpoint_saved", "upload_retry"} <= {r["event"] for r in _records(tmp_path / "out")}
                   and STEPS in local.committed()):
            time.sleep(0.05)
        seen["local_while_down"] = local.committed()
        s3_proxy.up()

    watcher = threading.Thread(target=bring_back, daemon=True)
    watcher.start()
    trainer = Trainer(cfg)
    summary = trainer.fit()  # returns once the uploads are done
    watcher.join(10)
    assert summary["steps"] == STEPS
    # While the server was down, local retention kept every step still waiting for its upload.
    assert seen["local_while_down"] == SAVES
    records = read_metrics(tmp_path / "out")
    events = [r["event"] for r in records]
    retries = [r for r in records if r["event"] == "upload_retry"]
    assert retries and retries[0]["step"] == 3
    uploaded = [r["step"] for r in records if r["event"] == "uploaded"]
    assert uploaded == SAVES  # nothing committed was lost
    assert events.index("uploaded") > max(i for i, r in enumerate(records) if r["event"] == "train")
    remote = RemoteCheckpoints(open_store(url), "checkpoints/main/run")
    assert remote.committed() == [9, 12]  # remote retention: keep_last 2
    assert remote.manifest(12)["files"] == local.manifest(12)["files"]
    keys = open_store(url).list("checkpoints/main/run")
    assert {k.split("/")[3] for k in keys if "step-" in k} == {step_name(9), step_name(12)}  # no partial upload
    assert local.committed() == [9, 12]  # local retention once the uploads were done


def _gate_writes(monkeypatch):
    """Hold every background checkpoint file write until the returned event is set."""
    import trainer.checkpoint.async_save as async_save

    gate, real = threading.Event(), async_save.write_file

    def gated(path, obj, **kw):
        assert gate.wait(120), "the test never opened the gate"
        real(path, obj, **kw)

    monkeypatch.setattr(async_save, "write_file", gated)
    return gate


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_save_returns_before_the_shards_are_written_and_the_commit_waits_for_them(tmp_path, monkeypatch):
    gate = _gate_writes(monkeypatch)
    trainer = _trainer(tmp_path / "out")
    ckpt = trainer.checkpointer
    trainer.step()
    trainer.step()
    at_save = {k: v.clone() for k, v in trainer.engine.module.state_dict().items()}
    ckpt.save(trainer)  # back in the loop with every file write still held
    staging = ckpt.local.partial_path(2)
    assert staging.is_dir() and not [p.name for p in staging.rglob("*.pt")]  # no shard, no RNG file yet
    assert not (staging / "trainer.json").exists() and ckpt.local.committed() == []
    trainer.step()  # training changes the very tensors the save copied
    assert any(not torch.equal(v, at_save[k]) for k, v in trainer.engine.module.state_dict().items())
    # The commit thread is waiting for the rank's files: it cannot have committed, nor given up.
    assert not ckpt._commit_future.done() and ckpt.local.committed() == []
    gate.set()
    ckpt.close()
    assert ckpt.local.committed() == [2] and not ckpt.local.partials()
    manifest = ckpt.local.verify(2)
    assert not [f["path"] for f in manifest["files"] if f["path"].startswith(".")]  # the done markers are gone
    # The files hold the state as it was when save() returned, not the one training moved on to.
    saved = torch.load(ckpt.local.path(2) / "ds" / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    assert saved.keys() == at_save.keys() and all(torch.equal(saved[k], at_save[k]) for k in at_save)
    committed = [r for r in read_metrics(tmp_path / "out") if r["event"] == "committed"]
    assert committed[0]["bytes"] == sum(f["bytes"] for f in manifest["files"])


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_a_failed_background_write_stops_the_loop_and_commits_nothing(tmp_path, monkeypatch):
    import trainer.checkpoint.async_save as async_save
    from trainer.checkpoint.async_save import WriteFailed

    gate = _gate_writes(monkeypatch)
    real = async_save.write_file

    def full_disk(path, obj, **kw):
        if str(path).endswith("optim_states.pt"):
            raise OSError(28, "No space left on device", str(path))
        real(path, obj, **kw)

    trainer = _trainer(tmp_path / "out")
    ckpt = trainer.checkpointer
    trainer.step()
    monkeypatch.setattr(async_save, "write_file", full_disk)
    gate.set()
    ckpt.save(trainer)
    trainer.step()
    with pytest.raises(OSError, match="No space left on device"):  # the next save waits for the write first
        ckpt.save(trainer)
    assert trainer.state.step not in ckpt.saved
    with pytest.raises(WriteFailed, match=r"rank 0 failed to write its checkpoint files.*No space left on device"):
        ckpt.close()  # rank 0's commit read the rank's failure marker rather than waiting for it
    assert ckpt.local.committed() == [] and ckpt.local.partials() == [1]


def test_a_snapshot_is_a_copy_in_buffers_reused_by_the_next_one_and_keeps_shared_tensors_shared():
    import io

    from trainer.checkpoint.async_save import Snapshotter

    weight, gain = torch.randn(4, 3, requires_grad=True), torch.nn.Parameter(torch.ones(2))
    state = {"w": weight, "groups": [weight, (gain, 3)], "name": "x"}
    snapshot = Snapshotter()
    first = snapshot(state, "model.pt")
    assert first["w"] is first["groups"][0] and first["w"].data_ptr() != weight.data_ptr()
    assert torch.equal(first["w"], weight) and first["w"].requires_grad
    assert type(first["groups"][1][0]) is torch.nn.Parameter and first["groups"][1][1] == 3 and first["name"] == "x"
    with torch.no_grad():
        weight.add_(1.0)
    assert not torch.equal(first["w"], weight)  # training may change the original: the snapshot stays
    second = snapshot(state, "model.pt")
    assert second["w"].data_ptr() == first["w"].data_ptr() and torch.equal(second["w"], weight)
    buffer = io.BytesIO()
    torch.save(second, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded["w"] is loaded["groups"][0] and torch.equal(loaded["w"], weight)  # stored once, as before


def test_young_interval_from_measured_save_time():
    # δ = 60 s, M = 3 h: τ = √(2·60·10800) ≈ 1138 s, i.e. 114 steps of 10 s.
    assert young_interval_steps(60.0, 10.0, 3.0) == 114
    assert young_interval_steps(0.01, 100.0, 1.0) == 1


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_a_new_stage_starts_from_the_previous_stages_weights(tmp_path):
    """init_from: the weights of another run's checkpoint, a fresh optimizer and schedule (long-context stages)."""
    from trainer.train import Trainer
    from trainer.checkpoint.weights import checkpoint_weights

    first = from_dict(RunConfig, run_dict(tmp_path / "main", train_tokens=3 * 8 * 64))
    Trainer(first).fit()
    step = tmp_path / "main" / "checkpoints" / "step-00000003"
    weights, _ = checkpoint_weights(step)
    second = from_dict(RunConfig, run_dict(tmp_path / "long", train_tokens=2 * 8 * 64, init_from=str(step),
                                           batch={"seq_len": 128, "global_batch": 4, "micro_batch": 2},
                                           model={"rope_base": 50000.0}))
    trainer = Trainer(second)
    assert trainer.state.step == 0  # a new run, not a resume of the first
    for name, value in trainer.engine.module.state_dict().items():
        torch.testing.assert_close(value.float(), weights[name], rtol=0, atol=1e-2)  # bf16 copies of the fp32 master
    events = [json.loads(line) for line in open(tmp_path / "long" / "metrics.jsonl")]
    assert {"event": "initialized", "from": str(step), "step": 3} in events
    trainer.fit()
    with pytest.raises(ValueError, match="does not match model config"):
        Trainer(from_dict(RunConfig, run_dict(tmp_path / "bad", init_from=str(step), model={"d_model": 32})))
