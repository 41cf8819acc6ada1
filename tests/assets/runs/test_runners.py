"""run_task (assets/runs/runners.py): one Dagster run of one asset, under the run id the scheduler chose, tagged with
the process that runs it, with its environment for the run only; its outcome says what it made or why it failed.
The runners at work, in this process and in a pool: tests/assets/runs/test_parallel.py."""

import os
import uuid

from dagster import AssetKey, DagsterInstance, Definitions, Failure, MaterializeResult, asset

from assets.runs.dead import PID_TAG
from assets.runs.runners import Task, run_task


@asset
def counted():
    return MaterializeResult(metadata={"documents": int(os.environ["PRETRAIN_TEST_KEPT"]), "documents_in": 1171})


@asset
def refused():
    raise Failure(description="1 of 2 records is damaged (bad_json), over max_bad_fraction 0.2")


def test_a_run_takes_the_given_id_its_environment_and_reports_what_it_made_or_why_it_failed():
    instance = DagsterInstance.ephemeral()
    job = Definitions(assets=[counted, refused]).resolve_implicit_global_asset_job_def()
    run_id = str(uuid.uuid4())
    outcome = run_task(job, instance, Task(AssetKey("counted")), {"PRETRAIN_TEST_KEPT": "363"}, {"mine": "yes"}, run_id)
    assert (outcome.success, outcome.run_id, outcome.figures) == (True, run_id, "363 documents of 1,171")
    assert "PRETRAIN_TEST_KEPT" not in os.environ  # set for the run only
    tags = instance.get_run_by_id(run_id).tags
    assert tags["mine"] == "yes" and tags[PID_TAG] == str(os.getpid())

    failed = run_task(job, instance, Task(AssetKey("refused")), {}, {}, None)
    assert not failed.success and failed.run_id and failed.run_id != run_id
    assert failed.error == "1 of 2 records is damaged (bad_json), over max_bad_fraction 0.2"


def test_a_run_whose_events_the_command_writes_itself_prints_none(capfd):
    """`console_events=False`: the console logger prints no event (the command writes the event log from the instance,
    assets/runs/watch.py); the instance has them all."""
    instance = DagsterInstance.ephemeral()
    job = Definitions(assets=[counted, refused]).resolve_implicit_global_asset_job_def()
    run_id = str(uuid.uuid4())
    capfd.readouterr()
    outcome = run_task(job, instance, Task(AssetKey("counted")), {"PRETRAIN_TEST_KEPT": "1"}, {}, run_id,
                       console_events=False)
    assert outcome.success and run_id not in "".join(capfd.readouterr())
    assert {"STEP_START", "STEP_SUCCESS", "ASSET_MATERIALIZATION"} <= {
        e.dagster_event.event_type_value for e in instance.all_logs(run_id) if e.dagster_event}
