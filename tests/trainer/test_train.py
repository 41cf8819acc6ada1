"""The training loop end to end: learning, bf16 master weights, the batch ramp, ZeRO 1-3 on 2 ranks."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import REPO
from tests.trainer.conftest import read_metrics, run_dict, write_run
from trainer.config import RunConfig, from_dict

BIN = os.path.dirname(sys.executable)


def _trainer(tmp_path, **sections):
    from trainer.train import Trainer

    return Trainer(from_dict(RunConfig, run_dict(tmp_path / "out", **sections)))


@pytest.mark.slow  # ~15 s alone, more when the 2 cores are busy
def test_demo_model_learns_below_the_unigram_entropy(tmp_path):
    from trainer.train import Trainer

    cfg = from_dict(RunConfig, run_dict(
        tmp_path / "out", train_tokens=60 * 8 * 64, schedule={"kind": "cosine", "warmup_tokens": 5 * 8 * 64},
        optim={"lr": 1e-2}, metrics={"log_interval": 10, "eval_batches": 4, "tensorboard": True}))
    trainer = Trainer(cfg)
    entropy = trainer.train_source.unigram_entropy()
    summary = trainer.fit()
    losses = summary["losses"]
    assert summary["tokens"] == cfg.train_tokens and summary["steps"] == 60 and not summary["skipped"]
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0  # learns clearly (from ~ln 512 = 6.2)
    # Below what any context-free model can reach on this text: it uses context.
    assert summary["val_loss"]["text"] < entropy - 0.1, (summary["val_loss"], entropy)
    records = read_metrics(tmp_path / "out")
    train = [r for r in records if r["event"] == "train"]
    assert [r["step"] for r in train] == [10, 20, 30, 40, 50, 60]
    precision = next(r for r in records if r["event"] == "precision")
    assert precision["requested"] == "auto" and precision["dtype"] in ("bf16", "fp32")
    assert all(r["tokens_per_s"] > 0 and 0 < r["mfu"] <= 1
               and r["peak"] == f"CPU {precision['dtype']} matmul peak, measured" for r in train)
    assert [r["event"] for r in records].count("eval") == 1
    assert list((tmp_path / "out" / "tensorboard").glob("events.out.tfevents.*"))
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["steps"] == 60


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_bf16_weights_with_fp32_master_weights(tmp_path):
    trainer = _trainer(tmp_path, deepspeed={"zero_stage": 1, "bf16": True})
    trainer.step()
    module_params = list(trainer.engine.module.parameters())
    master = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    assert {p.dtype for p in module_params} == {torch.bfloat16}
    assert {p.dtype for p in master} == {torch.float32}
    # The bf16 weights are the rounded fp32 master weights (ZeRO-1 keeps them flat, in group order).
    flat_master = torch.cat([p.flatten() for p in master])
    assert flat_master.numel() >= sum(p.numel() for p in module_params)
    state = trainer.optimizer.state[master[0]]
    assert state["exp_avg"].dtype == torch.float32 and state["step"].item() == 1


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_batch_ramp_changes_accumulation_and_keeps_tokens_exact(tmp_path):
    trainer = _trainer(tmp_path, train_tokens=10 * 8 * 64,
                       batch={"global_batch": 8, "micro_batch": 2, "ramp_start": 2, "ramp_tokens": 8 * 64 * 3})
    accum = []
    while trainer.state.tokens < trainer.cfg.train_tokens:
        trainer.step()
        accum.append(trainer.engine.gradient_accumulation_steps())
    batches = [h["batch"] for h in trainer.history]
    assert batches == [2, 2, 2, 4, 4, 6] + [8] * 8  # 2 -> 8 in steps of 2 over the first 1,536 tokens
    assert accum == [b // 2 for b in batches]
    assert trainer.state.tokens == sum(batches) * 64 >= trainer.cfg.train_tokens
    assert [h["samples"][0] for h in trainer.history] == [sum(batches[:i]) for i in range(len(batches))]
    assert trainer.state.sample_index == sum(batches)


def test_bad_config_exits_2_naming_the_field(tmp_path):
    path = write_run(tmp_path / "run.json", model={"n_layer": 3})
    result = subprocess.run([sys.executable, "-m", "trainer", "--config", str(path)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "model.n_layer: unknown field" in result.stderr and str(path) in result.stderr


def _losses(run_json, *launcher):
    out = run_json.parent / "out"
    result = subprocess.run([*launcher, "--config", str(run_json)], cwd=REPO, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [r["loss"] for r in read_metrics(out) if r["event"] == "train"]


ALONE = (sys.executable, "-m", "trainer")
TORCHRUN_2 = (os.path.join(BIN, "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "trainer")
STEPS = {"train_tokens": 5 * 8 * 64}


@pytest.fixture(scope="module")
def one_rank_losses(tmp_path_factory):
    """The reference: one process, ZeRO-0, same global batch (8 = 4 micro-batches of 2)."""
    ref = {}
    for bf16 in (True, False):
        path = write_run(tmp_path_factory.mktemp("ref") / "run.json",
                         deepspeed={"zero_stage": 0, "bf16": bf16}, **STEPS)
        ref[bf16] = _losses(path, *ALONE)
    return ref


# Tolerances: fp32 differs only by the order of the gradient sums (measured ≤ 2e-6 over 5 steps);
# bf16 rounds the weights after each step, so reduction-order differences show (measured ≤ 6e-4).
@pytest.mark.slow
@pytest.mark.parametrize("stage, bf16, tol", [(1, True, 2e-3), (2, True, 2e-3), (3, True, 2e-3), (1, False, 1e-5)])
def test_zero_on_two_ranks_matches_one_rank(tmp_path, one_rank_losses, stage, bf16, tol):
    path = write_run(tmp_path / "run.json", deepspeed={"zero_stage": stage, "bf16": bf16}, **STEPS)
    losses = _losses(path, *TORCHRUN_2)
    reference = one_rank_losses[bf16]
    assert len(losses) == len(reference) == 5
    assert losses[0] == pytest.approx(reference[0], abs=1e-6)  # same initial weights and batch
    assert max(abs(a - b) for a, b in zip(losses, reference)) < tol, (losses, reference)
    assert losses[-1] < losses[0] - 0.5


@pytest.mark.slow
def test_deepspeed_launcher_two_ranks(tmp_path, one_rank_losses):
    path = write_run(tmp_path / "run.json", deepspeed={"zero_stage": 2}, **STEPS)
    port = str(29500 + os.getpid() % 1000)
    losses = _losses(path, os.path.join(BIN, "deepspeed"), "--num_gpus", "2", "--master_port", port,
                     "--module", "trainer")
    assert max(abs(a - b) for a, b in zip(losses, one_rank_losses[True])) < 2e-3


RECORDER = '''
from trainer.callbacks import Callback

CALLS = []


class Recorder(Callback):
    name = "recorder"

    def model_built(self, trainer, model): CALLS.append(("model_built",))
    def pre_step(self, trainer, rec): CALLS.append(("pre_step", rec.step))
    def pre_update(self, trainer, rec): CALLS.append(("pre_update", rec.step, rec.loss == rec.loss))
    def post_update(self, trainer, rec): CALLS.append(("post_update", rec.step, rec.verdict.apply))
    def post_step(self, trainer, rec): CALLS.append(("post_step", rec.step, trainer.state.step))
    def post_checkpoint(self, trainer, step): CALLS.append(("post_checkpoint", step))
    def close(self, trainer, ok): CALLS.append(("close", ok))
'''


@pytest.mark.slow  # a DeepSpeed engine and 2 steps
def test_callbacks_are_called_at_their_points_in_order(tmp_path, monkeypatch):
    import sys

    from trainer.train import Trainer

    (tmp_path / "recorder.py").write_text(RECORDER)
    monkeypatch.setenv("PRETRAIN_TRAINER_CALLBACKS", f"{tmp_path / 'recorder.py'}:Recorder")
    trainer = Trainer(from_dict(RunConfig, run_dict(tmp_path / "out", train_tokens=2 * 8 * 64,
                                                    checkpoint={"interval_steps": 1})))
    assert [cb.name for cb in trainer.callbacks] == ["watchdog", "recorder", "canary", "sdc", "guard", "straggler",
                                                     "health", "checkpointer", "metrics"]
    assert set(trainer.stateful()) == {"train", "canary", "sdc", "guard"}
    trainer.fit()
    calls = sys.modules["_callbacks_recorder"].CALLS
    # Post hooks run in reverse: the checkpointer's post_step (after the recorder in the list) saves first.
    step = lambda s: [("pre_step", s), ("pre_update", s, True), ("post_update", s, True), ("post_checkpoint", s + 1),
                      ("post_step", s, s + 1)]
    assert calls == [("model_built",), *step(0), *step(1), ("close", True)]
    assert not trainer.watchdog._thread.is_alive()  # closed


def _rank_pids(run_json) -> dict[int, int]:
    """{rank: pid} of the trainer processes on `run_json`, from /proc (their RANK variable)."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = open(f"/proc/{entry.name}/cmdline", "rb").read().split(b"\0")
            environ = dict(v.split(b"=", 1) for v in open(f"/proc/{entry.name}/environ", "rb").read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        if b"trainer" in argv and str(run_json).encode() in argv and b"RANK" in environ and b"torchrun" not in argv[1]:
            found[int(environ[b"RANK"])] = int(entry.name)
    return found


@pytest.mark.slow  # ~40 s: 2 ranks stopped mid-run and resumed, and the reference run
def test_a_signal_to_one_rank_stops_every_rank_after_the_same_step_checkpointed_and_a_restart_resumes_exactly(tmp_path):
    """SIGINT to rank 1 alone (as a stopped Dagster run or scancel sends it): the ranks agree on it in the step's
    gather, both checkpoint after that step and exit 7 (failure.json: stopped); run again, the job resumes there and
    ends with the losses of a run never stopped."""
    from tests.trainer.faults import fault_env

    sections = dict(train_tokens=16 * 8 * 64, deepspeed={"zero_stage": 1}, checkpoint={"keep_last": 20},
                    metrics={"log_interval": 1, "eval_batches": 0, "tensorboard": False})
    run = write_run(tmp_path / "stopped" / "run.json", **sections)
    out = run.parent / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    # torchrun polls its ranks every 0.1 s by default and stops those still running once one has exited: the ranks
    # leave together (a barrier), but their interpreters' shutdowns differ by more than that; at 2 s it sees both.
    torchrun = [os.path.join(BIN, "torchrun"), "--standalone", "--nproc_per_node", "2", "--monitor-interval", "2",
                "-m", "trainer", "--config", str(run)]
    job = subprocess.Popen(torchrun, cwd=REPO, env={**env, **fault_env("slow:seconds=0.25")},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (out / "metrics.jsonl").exists() or not [
                r for r in read_metrics(out) if r["event"] == "train" and r["step"] >= 3]:
            assert job.poll() is None and time.monotonic() < deadline, "no step 3 in time"
            time.sleep(0.05)
        os.kill(_rank_pids(run)[1], signal.SIGINT)
        output, _ = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 1  # torchrun's own status when its ranks failed
    # Both ranks stopped by the signal, each with its own exit record (the signalled rank and the one told in the
    # step's gather), neither left waiting in a collective. torchrun reports each rank's status as it polls: one whose
    # interpreter shutdown, after its exit record and the leaving barrier, outlasts the poll on 2 busy cores is
    # SIGTERMed by torchrun and shows -15 there, so the records, not torchrun's codes, say how each rank left.
    assert output.count("error: stopped by a signal (SIGINT; rank(s) [1])") == 1, output[-3000:]
    assert output.count("error: stopped by a signal (on another rank; rank(s) [1])") == 1, output[-3000:]
    codes = re.findall(r"exitcode\s+: (-?\d+)", output)
    assert "7" in codes and set(codes) <= {"7", "-15"}, output[-3000:]
    failure = json.loads((out / "failure.json").read_text())
    assert failure["kind"] == "stopped" and failure["exit_status"] == 7
    [stopped] = [r for r in read_metrics(out) if r.get("event") == "stopped"]
    assert stopped["ranks"] == [1] and 3 <= stopped["step"] < 16
    from trainer.checkpoint.store import LocalCheckpoints

    assert LocalCheckpoints(out / "checkpoints").committed()[-1] == stopped["step"]  # checkpointed where it stopped

    os.rename(out / "failure.json", out / "failure-1.json")
    subprocess.run(torchrun, cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    [resumed] = [r for r in read_metrics(out) if r.get("event") == "resumed"]
    assert resumed["step"] == stopped["step"]
    reference = write_run(tmp_path / "reference" / "run.json", **sections)
    subprocess.run([*torchrun[:-1], str(reference)], cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    losses = lambda o: {r["step"]: r["loss"] for r in read_metrics(o) if r["event"] == "train"}  # noqa: E731
    assert losses(out) == losses(reference.parent / "out") and len(losses(out)) == 16
