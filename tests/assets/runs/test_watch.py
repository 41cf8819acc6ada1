"""RunWatch (assets/runs/watch.py): the warnings and errors of a run, read from its event log once each, by their first
line; a training run's last step, read from its trainer's metrics.jsonl from where its job started. On a real
training run under `pretrain materialize`: tests/assets/runs/test_progress.py."""

import io
import json
import os
import re
import uuid

from dagster import AssetKey, DagsterInstance, Definitions, Failure, asset

from assets.runs.runners import Task, run_task
from assets.runs.watch import WORK_TAG, RunWatch
from trainer.job.detach import Job, write_job


@asset
def talks(context):
    context.log.info("an info line, not for the terminal")
    context.log.warning("the input has 3 files, the recipe expects 4")
    context.log.error("two lines\nthe second is in the log file only")
    return 1


@asset
def fails(context):
    raise Failure(description="no documents")


def run(instance, key) -> str:
    job = Definitions(assets=[talks, fails]).resolve_implicit_global_asset_job_def()
    run_id = str(uuid.uuid4())
    run_task(job, instance, Task(AssetKey(key)), {}, {}, run_id)
    return run_id


def test_a_runs_warnings_and_errors_come_once_each_by_their_first_line_and_its_whole_event_log_to_the_log():
    instance = DagsterInstance.ephemeral()
    log = io.StringIO()
    watch = RunWatch(instance, log)
    talking, failing = run(instance, "talks"), run(instance, "fails")
    watch.add(talking, "curation/talks")
    watch.add(failing, "curation/fails")
    assert watch.poll() == ["pretrain: curation/talks: warning: the input has 3 files, the recipe expects 4",
                            "pretrain: curation/talks: error: two lines [...]"]
    assert watch.poll() == []
    # The failure itself is the command's to report, with its error (assets/runs/parallel.py).
    assert watch.remove(failing) == [] and watch.remove(talking) == [] and watch.runs == {}

    # Every event of both runs, in order, as Dagster's console logger writes them (RUN_START for PIPELINE_START), the
    # failure with its error's trace.
    text = log.getvalue()
    for run_id in (talking, failing):
        written = re.findall(rf"^\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{{4}} - dagster - \w+ - __ASSET_JOB - {run_id} - (.*)$",
                             text, re.M)
        events = instance.all_logs(run_id)
        assert len(written) == len(events)
        for line, event in zip(written, events):
            assert line.endswith(event.message.splitlines()[0])
    assert f" - DEBUG - __ASSET_JOB - {talking} - {os.getpid()} - talks - STEP_START - Started execution of step" in text
    assert f" - ERROR - __ASSET_JOB - {failing} - {os.getpid()} - RUN_FAILURE - " in text
    assert "dagster._core.definitions.events.Failure: no documents\n\nStack Trace:" in text
    assert "the second is in the log file only" in text


def test_a_training_run_shows_its_jobs_last_step_a_line_half_written_waits(tmp_path):
    instance = DagsterInstance.ephemeral()
    run_id = run(instance, "talks")
    watch = RunWatch(instance)
    watch.add(run_id, "training/main")
    watch.poll()
    assert watch.training() == []  # the run names no training job (yet)

    work, out = tmp_path / "work", tmp_path / "work" / "out"
    out.mkdir(parents=True)
    (work / "run.json").write_text(json.dumps({"output_dir": str(out), "train_tokens": 4096}))
    earlier = json.dumps({"event": "train", "step": 9, "tokens": 9, "loss": 1.0}) + "\n"  # an earlier job's
    train = [{"event": "train", "step": s, "tokens": 512 * s, "loss": 7.0 - s / 10, "tokens_per_s": 900.0}
             for s in (1, 2, 3)]
    lines = [json.dumps(r) + "\n" for r in train]
    (out / "metrics.jsonl").write_text(earlier + lines[0] + json.dumps({"event": "eval", "step": 1}) + "\n" + lines[1]
                                       + lines[2][:20])
    write_job(work, Job(pid=None, host=None, started_ticks=None, started_at=0.0, attempt=1, command=["python"],
                        log=str(work / "job-1.log"), metrics_offset=len(earlier)))
    instance.add_run_tags(run_id, {WORK_TAG: str(work)})
    watch.poll()
    assert watch.training() == [("training/main", train[1], 4096)]
    with open(out / "metrics.jsonl", "a") as f:
        f.write(lines[2][20:])
    watch.poll()
    assert watch.training() == [("training/main", train[2], 4096)]
