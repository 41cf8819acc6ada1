"""Failure detection on 2 ranks (torchrun, gloo): a hung rank, a straggler, corrupt gradients, a layer
blowing up. Faults are injected with PRETRAIN_TEST_FAULT (the test-only callback tests/trainer/faults.py)."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.trainer.conftest import read_metrics, write_run
from tests.trainer.faults import fault_env

BIN = os.path.dirname(sys.executable)
TORCHRUN_2 = (os.path.join(BIN, "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "trainer")
ALONE = (sys.executable, "-m", "trainer")


def _run(run_json, *, fault: str | None = None, launcher=TORCHRUN_2, expect: int = 0):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}  # also for the module fixture
    env.pop("PRETRAIN_TEST_FAULT", None)
    if fault:
        env.update(fault_env(fault))
    result = subprocess.run([*launcher, "--config", str(run_json)], cwd=REPO, capture_output=True, text=True,
                            timeout=900, env=env)
    assert result.returncode == expect, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _final_losses(out) -> dict[int, float]:
    """step -> loss; after a restart the resumed attempt's record of a step wins."""
    return {r["step"]: r["loss"] for r in read_metrics(out) if r["event"] == "train"}


def _events(out, name):
    return [r for r in read_metrics(out) if r.get("event") == name]


@pytest.mark.slow
def test_a_hung_rank_is_named_with_its_step_and_ends_the_job(tmp_path):
    # The launcher's restart after this, resuming to the same losses: tests/resources/test_launcher.py.
    hung = write_run(tmp_path / "run.json", train_tokens=10 * 8 * 64, deepspeed={"zero_stage": 1, "bf16": True},
                     checkpoint={"interval_steps": 3},
                     watchdog={"min_timeout_s": 15, "first_steps": 2, "step_factor": 5})
    first = _run(hung, fault="hang:rank=1,step=7,seconds=600", expect=1)  # torchrun's status whatever the ranks'
    out = hung.parent / "out"
    failure = json.loads((out / "failure.json").read_text())
    assert failure["kind"] == "hang" and failure["exit_status"] == 4
    assert failure["rank"] == 1 and failure["step"] == 7 and failure["ranks"] == [1], failure
    # Rank 1 sleeps in the fault hook; rank 0 is found waiting for it in the gradient reduction.
    assert "rank 1 (host" in failure["message"]
    assert "stuck outside any collective at tests/trainer/faults.py" in failure["message"]
    assert "rank(s) [0] wait for it in a collective" in failure["message"]
    assert "exitcode  : 4" in first.stderr and "watchdog: step 7 did not finish" in first.stderr
    assert [e["rank"] for e in _events(out, "hang")] == [1]
    # Train records count steps taken: the hung step (index 7) would have been record 8.
    assert {r["step"] for r in read_metrics(out) if r["event"] == "train"} == set(range(1, 8))


@pytest.mark.slow
def test_a_slowed_rank_is_reported_as_a_straggler_and_the_other_is_not(tmp_path):
    run = write_run(tmp_path / "run.json", train_tokens=12 * 8 * 64, deepspeed={"zero_stage": 1},
                    straggler={"factor": 1.5, "window": 6, "steps": 3, "min_excess_s": 0.05})
    _run(run, fault="slow:rank=1,seconds=0.4")
    out = run.parent / "out"
    stragglers = _events(out, "straggler")
    assert [e["rank"] for e in stragglers] == [1], stragglers
    assert stragglers[0]["step"] <= 4  # within a few steps: the 3rd slow step of the window
    assert stragglers[0]["host"] and "rank 1" in stragglers[0]["message"]
    busy = [r["rank_busy_s"] for r in read_metrics(out) if r["event"] == "train"]
    assert all(b[1] > b[0] + 0.3 for b in busy)  # the per-rank figure behind it, in every train record


SDC_RUN = dict(train_tokens=10 * 8 * 64, deepspeed={"zero_stage": 1, "bf16": True}, sdc={"canary_interval": 2})


@pytest.fixture(scope="module")
def skipped_step_5(tmp_path_factory):
    """The reference: the same run, simply not applying step 5."""
    skipped = write_run(tmp_path_factory.mktemp("skip") / "run.json", **SDC_RUN)
    _run(skipped, fault="skip:step=5")
    return _final_losses(skipped.parent / "out")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["scale", "bitflip"])
def test_a_rank_with_corrupt_gradients_is_named_and_its_step_not_applied(tmp_path, skipped_step_5, mode):
    corrupt = write_run(tmp_path / "corrupt" / "run.json", **SDC_RUN)
    _run(corrupt, fault=f"corrupt:rank=1,step=5,mode={mode}")
    out = corrupt.parent / "out"
    sdc = _events(out, "sdc")
    assert [(e["rank"], e["step"]) for e in sdc] == [(1, 5)], sdc
    assert sdc[0]["figures"][0]["figure"] == "grad_norm"
    skips = _events(out, "skip")
    assert [s["step"] for s in skips] == [5] and skips[0]["reason"].startswith("sdc: rank 1")
    assert _final_losses(out) == skipped_step_5
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 10 and not summary["skipped"]  # not a spike-guard strike
    canaries = _events(out, "canary")
    assert [c["step"] for c in canaries] == [2, 4, 6, 8, 10]
    assert all(c["alarm"] is None and c["ranks"] == [] for c in canaries)  # both ranks agree on the canary


@pytest.mark.slow
def test_repeated_corruption_from_one_rank_stops_the_job_naming_it(tmp_path):
    run = write_run(tmp_path / "run.json", train_tokens=12 * 8 * 64, deepspeed={"zero_stage": 1},
                    sdc={"max_offences": 2})
    result = _run(run, fault="corrupt:rank=1,step=4;corrupt:rank=1,step=6", expect=1)
    failure = json.loads((run.parent / "out" / "failure.json").read_text())
    assert failure["kind"] == "sdc" and failure["exit_status"] == 5 and failure["rank"] == 1
    assert "rank 1" in failure["message"] and "sdc.max_offences = 2" in result.stderr


@pytest.mark.slow  # a DeepSpeed engine or a trainer subprocess: seconds to minutes on 2 cores
def test_a_blown_up_layer_is_flagged_in_the_metrics_and_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = write_run(tmp_path / "run.json", train_tokens=10 * 8 * 64, deepspeed={"zero_stage": 0, "bf16": False},
                    health={"interval": 2, "growth": 3.0}, guard={"enabled": False},
                    metrics={"log_interval": 1, "eval_batches": 1, "tensorboard": True})
    _run(run, fault="blowup:layer=1,step=8,factor=10", launcher=ALONE)
    out = run.parent / "out"
    health = _events(out, "health")
    assert [h["step"] for h in health] == [0, 2, 4, 6, 8]
    assert set(health[0]["layers"]) == {"embedding", "block.0", "block.1", "head"}
    assert set(health[0]["layers"]["block.0"]) == {"weight_rms", "act_rms", "grad_norm"}
    alarms = _events(out, "health_alarm")
    assert alarms and {a["step"] for a in alarms} == {8}
    assert ("block.1", "weight_rms") in {(a["layer"], a["metric"]) for a in alarms}
    # Nothing before the blown-up block changed (its gradients may: they flow back through it).
    assert not [a for a in alarms if a["layer"] in ("embedding", "block.0") and a["metric"] != "grad_norm"]
    weights = health[-1]["layers"]["block.1"]["weight_rms"]
    assert weights == pytest.approx(10 * health[-2]["layers"]["block.1"]["weight_rms"], rel=0.05)
    events = EventAccumulator(str(out / "tensorboard")).Reload()
    assert [e.step for e in events.Scalars("health/block.1/weight_rms")] == [0, 2, 4, 6, 8]
    assert "health/block.0/act_rms" in events.Tags()["scalars"]
