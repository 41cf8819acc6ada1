"""trainer/job/detach.py: a command run detached under the wrapper, recorded in job.json, signalled, summarised."""

import json
import os
import signal
import sys
import time

import pytest

from trainer.job.detach import Job, job_summary, read_job, start_job, submit_job, write_job


def wait_until_ended(work, timeout=30.0) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = read_job(work)
        if job.exit_status is not None:
            return job
        time.sleep(0.05)
    pytest.fail(f"the job in {work} did not end within {timeout} s")


def test_a_job_runs_in_its_own_session_and_records_its_exit_status(tmp_path):
    code = "import os, sys, time; print(os.getsid(0), flush=True); time.sleep(0.5); sys.exit(3)"
    job = start_job([sys.executable, "-c", code], work=tmp_path, env=dict(os.environ), attempt=2, metrics_offset=17,
                    extra={"by": "test"})
    assert job.alive() and job.exit_status is None and job.attempt == 2 and job.metrics_offset == 17
    assert os.getsid(job.pid) == job.pid != os.getsid(0)  # a session of its own: our signals do not reach it
    ended = wait_until_ended(tmp_path)
    assert ended.exit_status == 3 and not ended.alive() and ended.extra == {"by": "test"}
    assert open(ended.log).read().split() == [str(job.pid)]  # the command's output is in the job's log


def test_sigterm_reaches_the_command_once_through_the_wrapper(tmp_path):
    code = ("import signal, sys, time\n"
            "def stop(signum, frame):\n    print('drain', flush=True); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\ntime.sleep(60)\n")
    job = start_job([sys.executable, "-c", code], work=tmp_path, env=dict(os.environ), attempt=1)
    while "ready" not in open(job.log).read():
        time.sleep(0.05)
    job.signal(signal.SIGTERM)
    ended = wait_until_ended(tmp_path)
    assert ended.exit_status == 0 and open(job.log).read().split() == ["ready", "drain"]


def test_a_killed_job_is_gone_and_a_reused_pid_is_not_taken_for_it(tmp_path):
    job = start_job([sys.executable, "-c", "import time; time.sleep(60)"], work=tmp_path, env=dict(os.environ), attempt=1)
    job.kill()
    deadline = time.monotonic() + 10
    while read_job(tmp_path).alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = read_job(tmp_path)
    assert not gone.alive() and gone.exit_status is None  # killed with its wrapper: no status was written
    # This very process, under the job's record with another start time: a pid now used by something else.
    me = Job(pid=os.getpid(), host=job.host, started_ticks=1, started_at=0.0, attempt=1, command=[], log="")
    assert not me.alive()
    write_job(tmp_path, me)
    assert read_job(tmp_path) == me
    (tmp_path / "job.json").write_text("{not json")
    with pytest.raises(ValueError, match="job.json: not a job file"):
        read_job(tmp_path)


def test_the_summary_reads_the_jobs_own_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "run.json").write_text(json.dumps({"stage": "main", "train_tokens": 1000, "output_dir": str(out)}))
    records = [{"event": "train", "step": 1, "tokens": 100, "loss": 9.0, "tokens_per_s": 50.0},
               {"event": "resumed", "step": 1}, {"event": "train", "step": 2, "tokens": 200, "loss": 8.5,
                                                   "tokens_per_s": 100.0}]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert job_summary(tmp_path) is None
    start_job([sys.executable, "-c", "import time; time.sleep(60)"], work=tmp_path, env=dict(os.environ), attempt=1)
    try:
        shown = job_summary(tmp_path)
        assert (shown["stage"], shown["state"], shown["step"], shown["tokens"], shown["loss"]) == ("main", "running", 2, 200, 8.5)
        assert shown["eta_s"] == pytest.approx(8.0) and shown["resumes"] == 1
    finally:
        read_job(tmp_path).kill()


@pytest.mark.slow  # a real Slurm cluster (tests/slurm_cluster.py): ~10 s with a warm cluster
def test_on_slurm_the_job_is_a_batch_job_known_by_its_id_and_signalled_through_scancel(slurm, tmp_path):
    """submit_job: sbatch queues the wrapper held, job.json names the Slurm job id before it is released; Slurm says
    whether it runs; a signal reaches the srun step (not the batch script), and the wrapper records the status."""
    code = ("import signal, sys, time\n"
            "def stop(signum, frame):\n    print('drain', flush=True); sys.exit(0)\n"
            "signal.signal(signal.SIGINT, stop)\nprint('ready', flush=True)\ntime.sleep(120)\n")
    sbatch = ["sbatch", "--export=ALL", "--job-name", "job-test", "--nodes", "1", "--partition", slurm.partition,
              "--time", "00:05:00"]
    job = submit_job(sbatch, ["srun", "--export=ALL", sys.executable, "-c", code], work=tmp_path,
                     env=dict(os.environ), attempt=3, extra={"restarts": [{"attempt": 2, "reason": "exit status 4"}]})
    [queued] = [j for j in slurm.jobs() if j["JobId"] == job.slurm_job_id]
    assert queued["JobName"] == "job-test" and job.pid is None and job.identity == ("slurm", job.slurm_job_id)
    deadline = time.monotonic() + 60
    while "ready" not in open(job.log).read():
        assert time.monotonic() < deadline, open(job.log).read()
        time.sleep(0.1)
    running = read_job(tmp_path)  # the wrapper, started by Slurm, wrote its pid and host, under the same identity
    assert running.identity == job.identity and running.pid is not None and running.alive()
    assert job_summary(tmp_path)["slurm_job_id"] == job.slurm_job_id
    assert job_summary(tmp_path)["restarts"] == [{"attempt": 2, "reason": "exit status 4"}]
    job.signal(signal.SIGINT)
    ended = wait_until_ended(tmp_path, timeout=60)
    assert ended.exit_status == 0 and open(job.log).read().split() == ["ready", "drain"]
    deadline = time.monotonic() + 30
    while job.alive():  # Slurm's word, once the batch script is done
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert (tmp_path / "job-3.sbatch").read_text().startswith("#!/bin/bash")


@pytest.mark.slow  # the Slurm cluster
def test_sbatch_refusing_the_job_is_an_error_with_its_message(slurm, tmp_path):
    with pytest.raises(RuntimeError, match="sbatch refused the training job.*(?i:partition)"):
        submit_job(["sbatch", "--partition", "no-such-partition"], ["true"], work=tmp_path, env=dict(os.environ),
                   attempt=1)
    assert read_job(tmp_path) is None  # nothing recorded for a job that does not exist
