"""`pretrain` end to end on a copy of the demo recipe: materialize, status, staleness, where, docs.

The whole demo materialized, then changed, is tests/assets/test_staleness_demo.py (one run of it for both).
"""

import json

import pytest
import yaml
from dagster import AssetKey, DagsterInstance

from assets.cli import main
from assets.recipe import DEMO_RECIPE


def write_demo_copy(path, mutate=lambda raw: None):
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    raw["base_dir"] = str((DEMO_RECIPE.parent / raw["base_dir"]).resolve())
    mutate(raw)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def status_rows(capsys) -> dict[str, tuple[str, str]]:
    capsys.readouterr()
    assert main(["status"]) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        key, state, cause = line.split(None, 2)
        if state not in ("restart", "verdict"):  # an asset's further lines: a job's restarts, an ablation's verdict
            rows[key] = (state, cause)
    return rows


def materialization_counts(keys) -> dict[str, int]:
    instance = DagsterInstance.get()
    return {key: len(instance.fetch_materializations(AssetKey.from_user_string(key), limit=100).records) for key in keys}


def set_math_min_chars(raw, value):
    for source in raw["sources"]:
        if source["name"] == "math":
            source.setdefault("reader", {})["min_text_chars"] = value


def shorter_training(raw):
    """The demo's every stage, with an eighth of the tokens of its main run (17 steps) and proxy runs, a quarter of
    the other stages' and fewer evaluation items: this test is about what turns stale and what reruns, not about
    how well the models learn (`make demo` runs it whole)."""
    training = raw["training"]
    training["main"]["train_tokens"] //= 8
    training["main"]["batch"]["ramp_tokens"] //= 8
    training["main"]["schedule"]["warmup_tokens"] //= 8
    for stage in training["long_context"]:
        stage["train_tokens"] //= 4
    training["anneal"]["train_tokens"] //= 4
    raw["mixing"]["proxy"]["train_tokens"] //= 8
    raw["evaluation"]["limit"] = 10


def damaged_jsonl(tmp_path, shared_data):
    """Six real C4 documents, then four records that are not JSON documents (4 of 10 bad)."""
    import gzip

    lines = gzip.open(shared_data / "jsonl" / "olmo_c4-sample.01.json.gz", "rt").read().splitlines()
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join(lines[:6] + ['{"text": "cut off', "not json at all", "{]", "{"]) + "\n")
    return damaged


def test_cli_errors_go_to_stderr_with_nonzero_status(tmp_path, monkeypatch, capsys):
    recipe = tmp_path / "recipe.yaml"
    write_demo_copy(recipe, lambda raw: raw["sources"][0].update(format="pdf"))
    assert main(["status", "--recipe", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert str(recipe) in err and "format" in err

    write_demo_copy(recipe)
    assert main(["where", "curation/nope/raw_crawl", "--recipe", str(recipe)]) == 2
    assert "no asset" in capsys.readouterr().err
    assert main(["where", "curation/math/raw_crawl", "--recipe", str(recipe)]) == 2
    assert "never been materialized" in capsys.readouterr().err
    assert main(["materialize", "--select", "curation/zzz/*", "--recipe", str(recipe)]) == 2
    assert "matches no asset" in capsys.readouterr().err


@pytest.mark.slow  # materializes assets through the CLI
def test_assets_write_to_s3_and_the_cli_reads_back(tmp_path, monkeypatch, capsys, s3):
    """The same asset code on the S3 backend: PRETRAIN_STORE names the bucket, nothing else changes."""
    recipe = tmp_path / "recipe.yaml"
    write_demo_copy(recipe)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    monkeypatch.setenv("PRETRAIN_STORE", f"s3://{s3.bucket}/factory")

    assert main(["materialize", "--select", "curation/code/raw_crawl"]) == 0
    capsys.readouterr()
    assert main(["where", "curation/code/raw_crawl"]) == 0
    uri, manifest_text = capsys.readouterr().out.split("\n", 1)
    manifest = json.loads(manifest_text)
    assert uri == f"s3://{s3.bucket}/factory/curation/code/raw_crawl/{manifest['version_key']}"
    keys = {obj["Key"] for obj in s3.client().list_objects_v2(Bucket=s3.bucket)["Contents"]}
    prefix = f"factory/curation/code/raw_crawl/{manifest['version_key']}"
    assert keys == {f"{prefix}/{entry['path']}" for entry in manifest["files"]} | {f"{prefix}/manifest.json"}
    # The tarball holds 1,385 .py files; the empty ones (__init__.py) are counted, not written.
    counts = manifest["counts"]
    assert counts["kept"] + counts["skipped"]["empty"] == 1385 and counts["kept"] > 1000

    assert main(["docs", "curation/code/raw_crawl", "--limit", "2"]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(docs) == 2 and all(doc["metadata"]["source"] == "code" for doc in docs)


@pytest.mark.slow  # materializes assets through the CLI
def test_a_source_past_its_bad_fraction_fails_and_commits_nothing(tmp_path, monkeypatch, capsys, shared_data):
    """Corrupt records beyond the recipe's threshold fail the asset with the source named; nothing is committed."""
    damaged = damaged_jsonl(tmp_path, shared_data)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "damaged",
        "sources": [{"name": "shaky", "format": "jsonl", "inputs": [str(damaged)], "reader": {"max_bad_fraction": 0.2}}],
    }))
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))

    assert main(["materialize"]) == 1
    captured = capsys.readouterr()
    assert "shaky" in captured.err and "bad_json" in captured.err
    assert status_rows(capsys)["curation/shaky/raw_crawl"] == ("missing", "never materialized")
    store_root = tmp_path / "pretrain-home" / "store"
    assert not list(store_root.rglob("manifest.json"))


@pytest.mark.parametrize(("env", "jobs", "started"), [
    ({"PRETRAIN_EXECUTOR_WORKERS": "2"}, "1", True),  # the runs execute in this process: its helpers start now
    ({"PRETRAIN_EXECUTOR_WORKERS": "2"}, "2", False),  # parallel jobs: each worker process starts its own
    ({"PRETRAIN_EXECUTOR_WORKERS": "1"}, "1", False),  # one worker: the tasks run in this process, no helper
    ({"PRETRAIN_EXECUTOR_WORKERS": "2", "PRETRAIN_EXECUTOR": "ray"}, "1", False),
    ({"PRETRAIN_EXECUTOR_WORKERS": "two"}, "1", False),  # left to the resource, which names the variable
    # Unset: the executor runs as many tasks at once as the run was given CPUs, and its helpers start now likewise.
    ({"PRETRAIN_CPUS": "2"}, "1", True),
    ({"PRETRAIN_CPUS": "1"}, "1", False),
])
def test_materialize_starts_the_local_helpers_before_dagster_loads(monkeypatch, env, jobs, started):
    """`pretrain materialize` starts the local executor's helpers first thing: a helper needs ~0.7 s to import
    datatrove, which then overlaps loading the code location rather than a short stage's first tasks."""
    from assets.cli.command import build_parser
    from assets.cli.materialize import start_local_helpers
    from pipelines.runner import WorkerPool

    WorkerPool.close_all()
    for name in ("PRETRAIN_EXECUTOR", "PRETRAIN_EXECUTOR_WORKERS", "PRETRAIN_JOBS", "PRETRAIN_CPUS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PRETRAIN_JOBS", jobs)
    try:
        start_local_helpers(build_parser().parse_args(["materialize", "--select", "curation/web/raw_crawl"]))
        pool = WorkerPool._pools.get(2)  # two workers: two helpers
        assert (pool is not None) == started and len(WorkerPool._pools) == int(started)
        if started:
            assert len(pool.processes) == 2 and pool.healthy()
    finally:
        WorkerPool.close_all()


def test_jobs_and_status_show_every_restart_and_left_out_node_from_the_jobs_files(pretrain_home, capsys):
    """`pretrain jobs` and `pretrain status` read a training job's restarts and excluded nodes from its job.json
    (the launcher writes them there), so they show them while the job runs, with no Dagster run following it."""
    from trainer.job.detach import Job, write_job

    work = pretrain_home / "work" / "training" / "main" / "abc123"
    work.mkdir(parents=True)
    (work / "run.json").write_text(json.dumps({"stage": "main", "train_tokens": 1000, "output_dir": str(work / "out")}))
    restarts = [{"attempt": 1, "time": 1.8e9, "reason": "exit status 4: hang (rank 1, step 7, host node-1): stuck"},
                {"attempt": 2, "time": 1.8e9 + 60, "reason": "exit status 5: sdc (rank 3, host node-2): outliers",
                 "excluded": "node-2", "why": "silent data corruption"}]
    write_job(work, Job(pid=None, host=None, started_ticks=None, started_at=1.8e9 + 120, attempt=3, command=["srun"],
                        log=str(work / "job-3.log"), exit_status=0, slurm_job_id="4242",
                        extra={"excluded_nodes": ["node-2"], "restarts": restarts}))
    capsys.readouterr()
    assert main(["jobs"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["stage", "state", "job"] and "restarts" in header and "excluded" in header
    assert row.split()[:3] == ["main", "done", "slurm:4242"] and " 2  node-2 " in row
    assert main(["status"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if " restart " in line]
    assert [line.split(None, 2)[:2] for line in rows] == [["training/main", "restart"]] * 2
    assert rows[0].endswith("exit status 4: hang (rank 1, step 7, host node-1): stuck")
    assert rows[1].endswith("outliers; left out node-2 (silent data corruption)")
