"""`pretrain materialize --jobs N`: independent assets run side by side, each a run in the persistent instance.

Overlap is read from the Dagster event log (each step's STEP_START and STEP_SUCCESS times), never from a
wall-clock figure.
"""

import pytest
import yaml
from dagster import AssetKey, DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter

from assets.cli import main
from assets.runs.parallel import CPUS_TAG, SESSION_TAG, THREADS_TAG
from assets.recipe import DEMO_RECIPE
from tests.assets.test_cli import damaged_jsonl


def demo_sources(path, names):
    """A recipe of the demo's sources `names` only, with their own reader and filter settings."""
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    path.write_text(yaml.safe_dump({
        "name": "two-sources", "base_dir": str((DEMO_RECIPE.parent / raw["base_dir"]).resolve()),
        "sources": [s for s in raw["sources"] if s["name"] in names]}, sort_keys=False))


def step_intervals(instance) -> dict[str, tuple[float, float, object]]:
    """{step key: (started, finished, run)} over every run of the instance."""
    steps = {}
    for run in instance.get_runs():
        started = {}
        for entry in instance.all_logs(run.run_id, of_type={DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS}):
            if entry.dagster_event.event_type == DagsterEventType.STEP_START:
                started[entry.step_key] = entry.timestamp
            else:
                steps[entry.step_key] = (started[entry.step_key], entry.timestamp, run)
    return steps


@pytest.mark.slow  # materializes assets through the CLI
def test_independent_steps_run_at_the_same_time(tmp_path, monkeypatch, capsys):
    recipe = tmp_path / "recipe.yaml"
    demo_sources(recipe, {"c4", "code"})
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    # Two chains, raw_crawl -> filtered, one per source, nothing connects c4's to code's; then the dedup over both.
    assert main(["materialize", "--select", "+curation/deduplicated", "--jobs", "2"]) == 0
    err = capsys.readouterr().err
    assert "[5/5] done     curation/deduplicated" in err
    # Each done line ends with what the run made, read from the asset's metadata: the dedup's documents kept.
    [dedup_line] = [line for line in err.splitlines() if "done     curation/deduplicated" in line]
    kept = DagsterInstance.get().get_latest_materialization_event(AssetKey(["curation", "deduplicated"]))
    meta = {k: v.value for k, v in kept.asset_materialization.metadata.items()}
    assert dedup_line.endswith(f": {meta['documents']:,} documents of {meta['documents_in']:,}"), dedup_line

    instance = DagsterInstance.get()
    steps = step_intervals(instance)
    dedup = steps.pop("curation__deduplicated")
    assert set(steps) == {f"curation__{s}__{stage}" for s in ("c4", "code") for stage in ("raw_crawl", "filtered")}
    # One run per asset, all of them tagged with the one `pretrain materialize` that made them.
    runs = {run.run_id: run for _, _, run in [*steps.values(), dedup]}
    assert len(runs) == 5 and len({run.tags[SESSION_TAG] for run in runs.values()}) == 1
    for key in ("curation/c4/filtered", "curation/code/filtered"):
        assert len(instance.fetch_materializations(AssetKey.from_user_string(key), limit=10).records) == 1

    # Within a chain the steps follow each other; across the chains some step of one source ran while one
    # of the other source did.
    for source in ("c4", "code"):
        assert steps[f"curation__{source}__raw_crawl"][1] <= steps[f"curation__{source}__filtered"][0]
    overlapping = [(a, b) for a, (a0, a1, _) in steps.items() if "__c4__" in a
                   for b, (b0, b1, _) in steps.items() if "__code__" in b and a0 < b1 and b0 < a1]
    assert overlapping, {k: v[:2] for k, v in steps.items()}
    # Runs that shared the two cores were given one thread each (OMP_NUM_THREADS, passed on to any trainer).
    # and one CPU each (PRETRAIN_CPUS: their data stages ran one task at a time, by default).
    for a, b in overlapping:
        assert steps[a][2].tags.get(THREADS_TAG) == steps[b][2].tags.get(THREADS_TAG) == "1"
        assert steps[a][2].tags.get(CPUS_TAG) == steps[b][2].tags.get(CPUS_TAG) == "1"
    # The dedup waits for both filters and then runs alone: it keeps every core (and its executor runs that many).
    assert dedup[0] >= max(end for _, end, _ in steps.values())
    assert THREADS_TAG not in dedup[2].tags and CPUS_TAG not in dedup[2].tags


@pytest.mark.slow  # materializes assets through the CLI
def test_a_failed_step_fails_the_command_and_what_does_not_depend_on_it_still_runs(tmp_path, monkeypatch, capsys, shared_data):
    damaged = damaged_jsonl(tmp_path, shared_data)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "one-damaged", "sources": [
        {"name": "good", "format": "jsonl", "inputs": [str(shared_data / "jsonl" / "olmo_c4-sample.02.json.gz")]},
        {"name": "shaky", "format": "jsonl", "inputs": [str(damaged)], "reader": {"max_bad_fraction": 0.2}}]}))
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))

    assert main(["materialize", "--jobs", "2"]) == 1
    err = capsys.readouterr().err
    assert "curation/shaky/raw_crawl failed (Dagster run " in err and "bad_json" in err
    assert "not materialized because of the failure" in err and "curation/deduplicated" in err

    instance = DagsterInstance.get()
    for stage in ("raw_crawl", "filtered"):  # as within one Dagster run: the other source's chain goes on
        assert len(instance.fetch_materializations(AssetKey(["curation", "good", stage]), limit=10).records) == 1
    assert not instance.fetch_materializations(AssetKey(["curation", "deduplicated"]), limit=10).records
    failed = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.FAILURE]))
    assert [run.asset_selection for run in failed] == [{AssetKey(["curation", "shaky", "raw_crawl"])}]


def test_jobs_must_be_positive(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PRETRAIN_JOBS", "zero")
    assert main(["materialize", "--select", "curation/web/raw_crawl"]) == 2
    assert "PRETRAIN_JOBS" in capsys.readouterr().err
    assert main(["materialize", "--jobs", "0"]) == 2
    assert "--jobs" in capsys.readouterr().err



def test_a_trainer_runs_on_the_cores_its_launch_settings_give_it():
    """The scheduler counts a trainer's cores from its asset's `launch` metadata, never from what else runs."""
    from types import SimpleNamespace

    from assets.runs.parallel import trainer_cores
    from resources.executor_env import available_cpus

    def node(**metadata):
        return SimpleNamespace(metadata=metadata)

    assert trainer_cores(node()) is None  # not a trainer: it takes the share the scheduler gives it
    assert trainer_cores(node(launch={"threads": 1, "max_restarts": 2})) == 1  # a proxy
    assert trainer_cores(node(launch={"launcher": "torchrun", "nproc_per_node": 2, "threads": 3})) == 6
    assert trainer_cores(node(launch={})) == available_cpus()  # no threads given: torch's default, every core
