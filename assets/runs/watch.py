"""What the runs of one `pretrain materialize` say while they run, for its terminal (assets/runs/progress.py):

    watch = RunWatch(instance, log)      # log: a text file, or None
    watch.add(run_id, "training/main")   # when the scheduler gives the run out (it chose the run id)
    watch.poll()                          # -> new warning and error lines of every run watched
    watch.training()                      # -> [(name, the trainer's last train record, its stage's train_tokens)]
    watch.remove(run_id)                  # -> the lines of that run not polled yet

Read from where the runs write, never from the process that executes them (this one, or a worker process):
- the run's Dagster event log, in the instance, from a cursor: every event into `log`, as Dagster's console logger
  writes it (which the runs then do not do: assets/runs/runners.py), and as lines for the terminal the warnings and
  errors (every event at WARNING or above, except the step and run failures, which the command reports itself);
- a training stage's step, loss and tokens/s: the launcher tags the run with its training job's work dir
  (resources/launcher.py, `pretrain/job_work`) once the job started; the job's run.json names the trainer's
  output_dir, whose metrics.jsonl gets one `train` record per logged step (trainer/reporting/metrics.py), the same
  records the launcher hands the asset after the job. Read from the job's own start (job.json's metrics_offset),
  so the records of an earlier attempt in the same file are not shown as this one's.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from resources.launcher import JOB_TAG

WORK_TAG = f"{JOB_TAG}_work"
PAGE = 500  # event records read at once


@dataclass
class _Watched:
    name: str
    cursor: str | None = None  # the event log's, after the last record read
    metrics: Path | None = None  # the trainer's metrics.jsonl, once the run names its job
    offset: int = 0  # bytes of metrics.jsonl read
    train_tokens: int | None = None
    last_train: dict | None = None
    pending: list[str] = field(default_factory=list)


class RunWatch:
    def __init__(self, instance, log=None):
        self.instance, self.log = instance, log
        self.runs: dict[str, _Watched] = {}

    def add(self, run_id: str, name: str) -> None:
        self.runs[run_id] = _Watched(name)

    def remove(self, run_id: str) -> list[str]:
        """Stop watching `run_id`; its warning and error lines not returned yet (read now: a run's last words come
        just before it ends)."""
        if run_id not in self.runs:
            return []
        lines = self._lines(run_id, self.runs[run_id])
        del self.runs[run_id]
        return lines

    def poll(self) -> list[str]:
        """The new warning and error lines of every run watched; reads the training records too."""
        lines = []
        for run_id, watched in list(self.runs.items()):
            lines += self._lines(run_id, watched)
            self._read_training(run_id, watched)
        return lines

    def training(self) -> list[tuple[str, dict, int | None]]:
        """(run name, its trainer's last `train` record, the stage's train_tokens) of every run that trains now."""
        return [(w.name, w.last_train, w.train_tokens) for w in self.runs.values() if w.last_train is not None]

    def _lines(self, run_id: str, watched: _Watched) -> list[str]:
        lines = []
        while True:
            page = self.instance.get_records_for_run(run_id, cursor=watched.cursor, limit=PAGE)
            for record in page.records:
                if self.log is not None:
                    self.log.write(event_text(record.event_log_entry) + "\n")
                line = _warning_line(watched.name, record.event_log_entry)
                if line:
                    lines.append(line)
            if page.records:
                watched.cursor = page.cursor
            if not page.has_more:
                return lines

    def _read_training(self, run_id: str, watched: _Watched) -> None:
        if watched.metrics is None and not self._find_metrics(run_id, watched):
            return
        try:
            with open(watched.metrics, "rb") as f:
                f.seek(watched.offset)
                data = f.read()
        except FileNotFoundError:  # the trainer has not written its first record yet
            return
        complete = data[:data.rfind(b"\n") + 1]  # a line being written is read next time, whole
        watched.offset += len(complete)
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == "train":
                watched.last_train = record

    def _find_metrics(self, run_id: str, watched: _Watched) -> bool:
        """Whether the run names its training job yet; if so, where the job's trainer writes its records."""
        from trainer.job.detach import read_job

        run = self.instance.get_run_by_id(run_id)
        work = run.tags.get(WORK_TAG) if run is not None else None
        if not work:
            return False
        try:
            config = json.loads((Path(work) / "run.json").read_text())
        except (OSError, ValueError):
            return False
        job = read_job(work)
        watched.metrics = Path(config.get("output_dir") or Path(work) / "out") / "metrics.jsonl"
        watched.offset = job.metrics_offset if job is not None else 0
        watched.train_tokens = config.get("train_tokens")
        return True


def event_text(entry) -> str:
    """An event as Dagster's console logger writes it: '2026-12-04 11:43:32 +0000 - dagster - DEBUG - __ASSET_JOB -
    <run id> - <step> - STEP_START - Started execution of step …', an error's whole trace after it."""
    event = entry.dagster_event
    kind = event.event_type_value.replace("PIPELINE_", "RUN_") if event is not None else None  # as the UI names them
    pid = str(event.pid) if event is not None and event.pid else None
    parts = [entry.job_name, entry.run_id, pid, entry.step_key, kind, entry.user_message or (event.message if event else "")]
    error = getattr(event.event_specific_data, "error", None) if event is not None else None
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(entry.timestamp))
    return (f"{stamp} - dagster - {logging.getLevelName(entry.level)} - " + " - ".join(p for p in parts if p)
            + (f"\n{error.to_string()}" if hasattr(error, "to_string") else ""))


def _warning_line(name: str, entry) -> str | None:
    """'pretrain: training/main: warning: RESTART 1/3: …' for an event at WARNING or above, its first line only
    (the whole of it is in the log file); None for the others, and for the step and run failures."""
    if entry.level < logging.WARNING:
        return None
    event = entry.dagster_event
    if event is not None and (event.is_step_failure or event.is_run_failure):
        return None
    message = (entry.user_message or (event.message if event is not None else "") or "").strip()
    if not message:
        return None
    first, _, rest = message.partition("\n")
    level = "warning" if entry.level < logging.ERROR else "error"
    return f"pretrain: {name}: {level}: {first}" + (" [...]" if rest.strip() else "")
