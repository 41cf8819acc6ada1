"""trainer.reporting.pipes: when a channel opens, JSON-safe records, and a real dagster-pipes round trip to a file."""

from __future__ import annotations

import json
import math

import pytest

from trainer.reporting.pipes import PIPES_ENV, PipesReporter, _plain


class FakeContext:
    """Stands in for dagster_pipes' PipesContext: records what the reporter asks of it."""

    def __init__(self):
        self.calls = []
        self.log = self

    def report_custom_message(self, payload):
        self.calls.append(("custom", payload))

    def info(self, line):
        self.calls.append(("log", line))

    def close(self):
        self.calls.append(("close", None))


def test_no_channel_without_the_pipes_environment_or_off_rank_0(monkeypatch):
    monkeypatch.delenv(PIPES_ENV, raising=False)
    assert PipesReporter.open() is None and PipesReporter.open(rank=0) is None
    monkeypatch.setenv(PIPES_ENV, "anything")
    for rank in (1, 3, -1):
        assert PipesReporter.open(rank) is None  # returns before dagster_pipes is even imported


def test_non_finite_floats_become_strings_at_any_depth_and_tuples_lists():
    record = {"loss": math.nan, "grad": {"norm": math.inf, "per_layer": (1.5, -math.inf)}, "step": 7,
              "ok": True, "name": "nan", "none": None, "nested": [[math.nan], {"x": 0.0}]}
    plain = _plain(record)
    assert plain == {"loss": "nan", "grad": {"norm": "inf", "per_layer": [1.5, "-inf"]}, "step": 7, "ok": True,
                     "name": "nan", "none": None, "nested": [["nan"], {"x": 0.0}]}
    assert json.loads(json.dumps(plain, allow_nan=False)) == plain  # strict JSON, no NaN literals
    assert record["loss"] is not plain["loss"] and math.isnan(record["loss"])  # the caller's dict is untouched


def test_the_reporter_passes_plain_records_log_lines_and_close_to_its_context():
    context = FakeContext()
    reporter = PipesReporter(context)
    reporter.record({"event": "train", "step": 10, "loss": math.inf})
    reporter.log("step 10 | loss inf")
    reporter.close()
    assert context.calls == [("custom", {"event": "train", "step": 10, "loss": "inf"}),
                             ("log", "step 10 | loss inf"), ("close", None)]


def test_a_real_pipes_channel_writes_the_messages_dagster_reads_back(monkeypatch, tmp_path):
    dagster_pipes = pytest.importorskip("dagster_pipes")
    monkeypatch.setattr(dagster_pipes.PipesContext, "_instance", None)  # the process-wide singleton
    messages = tmp_path / "messages.jsonl"
    context = {"asset_keys": ["trained_model"], "code_version_by_asset_key": None, "provenance_by_asset_key": None,
               "partition_key": None, "partition_key_range": None, "partition_time_window": None,
               "run_id": "run-1", "job_name": None, "retry_number": 0, "extras": {}}
    monkeypatch.setenv(PIPES_ENV, dagster_pipes.encode_param({"data": context}))
    monkeypatch.setenv("DAGSTER_PIPES_MESSAGES", dagster_pipes.encode_param({"path": str(messages)}))

    reporter = PipesReporter.open(0)
    assert reporter is not None
    reporter.record({"event": "train", "step": 3, "loss": math.nan})
    reporter.log("step 3 | loss nan")
    reporter.close()

    lines = [json.loads(line) for line in messages.read_text().splitlines()]
    methods = [m["method"] for m in lines]
    assert methods[0] == "opened" and methods[-1] == "closed"
    [custom] = [m for m in lines if m["method"] == "report_custom_message"]
    assert custom["params"]["payload"] == {"event": "train", "step": 3, "loss": "nan"}
    [log] = [m for m in lines if m["method"] == "log"]
    assert log["params"]["message"] == "step 3 | loss nan" and log["params"]["level"] == "INFO"
