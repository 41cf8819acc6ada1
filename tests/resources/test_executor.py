"""The executor resource: every data stage of the demo writes the same files on each stage's own task count two at a
time and in one task on a Ray cluster; a killed run resumes only its unfinished tasks; the Slurm kind builds the job
datatrove would submit.

The Ray cluster is real: `ray start --head` on 127.0.0.1 with 2 CPUs, in its own process group, stopped after.
No Slurm cluster exists here: the Slurm test stops at the `sbatch` call (a stand-in on PATH that records the
script it is handed and refuses it), so the script, the pickled executor and the configuration are checked,
and the waiting for a real job is not.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dill
import pytest

from datatrove.pipeline.base import PipelineStep

from assets.cli import main
from assets.recipe import DEMO_RECIPE, load_recipe
from resources.executor import ExecutorResource
from tests.ports import free_port

BIN = Path(sys.executable).parent


def committed(home: Path) -> dict[str, dict]:
    """{asset path: manifest} of every output in a PRETRAIN_HOME's store."""
    out = {}
    for path in (home / "store").rglob("manifest.json"):
        manifest = json.loads(path.read_text())
        out[manifest["asset"]] = manifest
    return out


@pytest.fixture
def ray_cluster(tmp_path, monkeypatch):
    """A one-node Ray cluster on loopback with 2 worker CPUs; yields its address."""
    # Ray takes the first non-loopback interface for its node address (it turns --node-ip-address 127.0.0.1
    # into that); with "clusters" off it keeps the loopback address, so nothing leaves 127.0.0.1. The
    # variable is for `ray start` and its workers; the attribute for this process, where Ray may be imported.
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # Ray turns token authentication on by itself when ~/.ray/auth_token exists (any earlier Ray session may
    # have left one): the cluster would then refuse a driver that sends none. Say what this test cluster uses.
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    ray_constants = pytest.importorskip("ray._private.ray_constants")
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    port = free_port()
    temp = Path("/tmp") / f"ray-{os.getpid()}-{port}"  # Ray's socket paths must stay short
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    log = tmp_path / "ray-start.log"
    with open(log, "w") as out:
        head = subprocess.Popen(
            [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
             "--num-cpus", "2", "--include-dashboard", "false", "--disable-usage-stats",
             # Free ports for the services that otherwise take fixed ones (8265, 10001).
             "--dashboard-port", str(free_port()), "--ray-client-server-port", str(free_port()),
             "--object-store-memory", str(100 * 2**20), "--temp-dir", str(temp)],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,  # its own group, killed after
        )
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None and time.monotonic() < deadline, f"ray start failed:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        # The whole group: `ray start` and the GCS, raylet and workers it started (its SIGTERM clean-up takes
        # over 20 s here, and nothing of the cluster is kept).
        try:
            os.killpg(head.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        head.wait()
        subprocess.run(["rm", "-rf", str(temp)])


# (PRETRAIN_EXECUTOR, PRETRAIN_EXECUTOR_TASKS, PRETRAIN_EXECUTOR_WORKERS): each stage's own task count (e.g. one per
# input file: 5 for cc's raw crawl, 7 for c4's) two at a time in helper processes, and one task a stage on a real Ray
# cluster. The two differ in executor and in task count at once, and every stage must still write the same bytes. One
# task on Ray, not two or the stages' own counts: a Ray task is a new actor process that imports the pipeline and
# loads its models (seconds each here; the Ray run took 165 s with two tasks a stage and 105 s with one, alone on the
# machine). A third run of one task in this process was dropped: it added ~70-100 s, and that path (the default
# executor) is every other data-stage test's.
RUNS = {"local-own-x2": ("local", "", "2"), "ray-1": ("ray", "1", "2")}
MODELS = ("curation/reference_lm", "curation/quality_classifier")
DATA_STAGES = "+tokenization/*/packed"  # every curation and tokenization asset of the recipe


def data_recipe(path: Path) -> Path:
    """The demo's data stages without its two slowest sources, `web` (a 34 MB crawl to extract) and `books` (95 plays
    whose filters took 52 s of a 95 s one-task run), and without `math`, a second JSON-lines source (7,473 problems)
    after c4. Every format (WARC, WET, JSON lines, a text archive), the quality model, the reference model's perplexity
    (cc's and cc_wet's web rules), the global dedup and the tokenizer are still there; a small tokenizer, three of the benchmarks."""
    import yaml

    demo = yaml.safe_load(DEMO_RECIPE.read_text())
    raw = {
        "name": "executor-test",
        "base_dir": str((DEMO_RECIPE.parent / demo["base_dir"]).resolve()),
        "sources": [source for source in demo["sources"] if source["name"] not in ("web", "books", "math")],
        **{section: demo[section] for section in ("dedup", "packing")},
        # 32 steps, not the demo's 128: trained twice here (once per home), and the comparison asks only that the
        # same text gives the same model files, which any step count shows.
        "reference": {**demo["reference"], "train_tokens": 32 * 16 * 64},
        # The web pages' boilerplate is among the demo classifier's negatives; this copy has no web source.
        "quality_classifier": {**demo["quality_classifier"], "boilerplate_sources": []},
        "decontamination": {**demo["decontamination"], "benchmarks": [
            "benchmarks/gsm8k_test.jsonl", "benchmarks/arc_easy_test.jsonl", "benchmarks/HumanEval.jsonl.gz"]},
        "tokenizer": {"vocab_size": 512, "sample_bytes": 200_000, "seed": 0},
    }
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.slow  # ~3-4 min: the recipe's curation and tokenization twice, once on Ray
def test_every_data_stage_writes_the_same_bytes_for_any_task_count_and_executor(tmp_path, monkeypatch, capsys,
                                                                                ray_cluster):
    recipe = data_recipe(tmp_path / "recipe.yaml")
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    runs = {}
    for run, (kind, tasks, workers) in RUNS.items():
        home = tmp_path / run
        monkeypatch.setenv("PRETRAIN_HOME", str(home))
        monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
        monkeypatch.setenv("PRETRAIN_EXECUTOR", kind)
        monkeypatch.setenv("PRETRAIN_EXECUTOR_TASKS", tasks)
        monkeypatch.setenv("PRETRAIN_EXECUTOR_WORKERS", workers)
        if kind == "ray":
            monkeypatch.setenv("PRETRAIN_RAY_ADDRESS", ray_cluster)
            monkeypatch.setenv("PRETRAIN_EXECUTOR_MEM_PER_CPU_GB", "0.5")
            # The two models train in the asset's own process whatever the executor (no executor stage in them):
            # the first home's outputs are reused here, as a committed output of the same version is (~12 s).
            for model in MODELS:
                shutil.copytree(tmp_path / "local-own-x2" / "store" / model, home / "store" / model)
        assert main(["materialize", "--select", DATA_STAGES]) == 0, capsys.readouterr().err[-3000:]
        runs[run] = committed(home)

    reference = runs["local-own-x2"]
    sources = [s.name for s in load_recipe(recipe).sources]
    assert {f"curation/{s}/{stage}" for s in sources for stage in ("raw_crawl", "filtered", "decontaminated")} | {
        f"tokenization/{s}/packed" for s in sources} | {
        "curation/quality_classifier", "curation/reference_lm", "curation/deduplicated", "tokenization/tokenizer"} \
        == set(reference)
    for run, manifests in runs.items():
        assert set(manifests) == set(reference), run
        for asset, manifest in reference.items():
            other = manifests[asset]
            # Byte for byte: the same files under the same names with the same sha256 (so the same data
            # version, and nothing downstream goes stale when a stage moves to a cluster), and the same counts.
            assert other["version_key"] == manifest["version_key"], (run, asset)
            assert other["files"] == manifest["files"], (run, asset)
            assert other["data_version"] == manifest["data_version"], (run, asset)
            assert other.get("counts") == manifest.get("counts"), (run, asset)
    # The stages really were split: with their own task counts the cc source's five WARCs and the c4 source's seven
    # files are read by several tasks, yet the outputs above are equal.
    assert len(reference["curation/cc/raw_crawl"]["inputs"]) >= 2
    assert len(reference["curation/c4/raw_crawl"]["inputs"]) >= 2


def test_executor_kind_and_settings_come_from_the_environment():
    assert ExecutorResource.from_env({}) == ExecutorResource(kind="local", workers=None)
    ray = ExecutorResource.from_env({"PRETRAIN_EXECUTOR": "ray", "PRETRAIN_RAY_ADDRESS": "10.0.0.5:6379"})
    assert (ray.kind, ray.ray_address, ray.workers) == ("ray", "10.0.0.5:6379", -1)
    slurm = ExecutorResource.from_env({
        "PRETRAIN_EXECUTOR": "slurm", "PRETRAIN_SLURM_PARTITION": "cpu", "PRETRAIN_SLURM_ACCOUNT": "llm",
        "PRETRAIN_EXECUTOR_CPUS_PER_TASK": "4",
    })
    assert (slurm.slurm_partition, slurm.slurm_sbatch_args, slurm.cpus_per_task) == ("cpu", {"account": "llm"}, 4)
    with pytest.raises(ValueError, match="PRETRAIN_EXECUTOR: 'spark'"):
        ExecutorResource.from_env({"PRETRAIN_EXECUTOR": "spark"})
    with pytest.raises(ValueError, match="slurm_partition"):
        ExecutorResource.from_env({"PRETRAIN_EXECUTOR": "slurm"})
    with pytest.raises(ValueError, match="PRETRAIN_EXECUTOR_WORKERS: 'two'"):
        ExecutorResource.from_env({"PRETRAIN_EXECUTOR_WORKERS": "two"})


def test_local_runs_as_many_tasks_at_once_as_the_run_was_given_cpus(monkeypatch):
    """No PRETRAIN_EXECUTOR_WORKERS: every CPU of a run alone, its share (PRETRAIN_CPUS) beside others, read when
    the run runs (a worker process of `pretrain materialize` builds the resource once and serves many runs)."""
    import os

    from resources.executor_env import CPUS_ENV

    monkeypatch.delenv(CPUS_ENV, raising=False)
    executor = ExecutorResource.from_env({})
    assert executor.local_workers() == len(os.sched_getaffinity(0))
    monkeypatch.setenv(CPUS_ENV, "3")
    assert executor.local_workers() == 3
    assert ExecutorResource.from_env({"PRETRAIN_EXECUTOR_WORKERS": "1"}).local_workers() == 1  # the setting wins
    monkeypatch.setenv(CPUS_ENV, "none")
    with pytest.raises(ValueError, match="^PRETRAIN_CPUS: expected a whole number of CPUs, 1 or more; got 'none'$"):
        executor.local_workers()


def test_environment_values_are_validated_by_pydantic_naming_the_variable():
    # An empty variable counts as unset; other variables in the mapping are not the executor's business.
    assert ExecutorResource.from_env({"PRETRAIN_EXECUTOR": "", "PRETRAIN_EXECUTOR_WORKERS": "", "HOME": "/root"}) \
        == ExecutorResource.from_env({})
    ray = ExecutorResource.from_env({"PRETRAIN_EXECUTOR": "ray", "PRETRAIN_EXECUTOR_WORKERS": "4",
                                     "PRETRAIN_EXECUTOR_MEM_PER_CPU_GB": "0.5", "PRETRAIN_SLURM_TIME": "01:00:00"})
    assert (ray.workers, ray.mem_per_cpu_gb, ray.slurm_time, ray.slurm_job_name) == (4, 0.5, "01:00:00", "pretrain")
    with pytest.raises(ValueError, match=r"^PRETRAIN_EXECUTOR_MEM_PER_CPU_GB: 'lots' is not a number$"):
        ExecutorResource.from_env({"PRETRAIN_EXECUTOR_MEM_PER_CPU_GB": "lots"})
    with pytest.raises(ValueError, match=r"^PRETRAIN_EXECUTOR_CPUS_PER_TASK: '1.5' is not an integer$"):
        ExecutorResource.from_env({"PRETRAIN_EXECUTOR_CPUS_PER_TASK": "1.5"})
    with pytest.raises(ValueError, match=r"^PRETRAIN_EXECUTOR: 'spark' is not one of local, ray, slurm$"):
        ExecutorResource.from_env({"PRETRAIN_EXECUTOR": "spark", "PRETRAIN_EXECUTOR_WORKERS": "two"})
    with pytest.raises(ValueError, match="executor.workers: must be >= 1"):  # a valid number, but not a valid setting
        ExecutorResource.from_env({"PRETRAIN_EXECUTOR_WORKERS": "0"})


def test_slurm_kind_builds_the_job_array_datatrove_submits(tmp_path, monkeypatch):
    """Everything up to sbatch: the executor's settings, the script and the pickled pipeline the nodes load."""
    from datatrove.executor import SlurmPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    # The stand-in sbatch keeps what it is given and refuses it, as a cluster without this partition would.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "sbatch").write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/sbatch.args\nfor last; do :; done\ncat "$last" > {tmp_path}/sbatch.script\n'
        'echo "sbatch: error: invalid partition specified" >&2\nexit 1\n'
    )
    (fake_bin / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")

    resource = ExecutorResource(kind="slurm", slurm_partition="cpu-long", slurm_job_name="curation-filter",
                                workers=8, cpus_per_task=2, mem_per_cpu_gb=1.5, slurm_time="02:00:00",
                                slurm_sbatch_args={"account": "llm"})
    logs = tmp_path / "logs"
    pipeline = [JsonlReader(str(tmp_path / "in")), JsonlWriter(str(tmp_path / "out"))]
    executor = resource.slurm_executor(pipeline, logging_dir=logs, tasks=40)
    assert isinstance(executor, SlurmPipelineExecutor)
    assert (executor.partition, executor.tasks, executor.workers, executor.job_name) == ("cpu-long", 40, 8, "curation-filter")
    assert executor.cpus_per_task == 2 and executor.time == "02:00:00" and executor.skip_completed

    with pytest.raises(subprocess.CalledProcessError):
        resource.run(pipeline, logging_dir=logs, tasks=40)

    script = (tmp_path / "sbatch.script").read_text()
    directives = dict(line[len("#SBATCH --"):].partition("=")[::2] for line in script.splitlines()
                      if line.startswith("#SBATCH --"))
    assert directives["partition"] == "cpu-long" and directives["job-name"] == "curation-filter"
    assert directives["array"] == "0-39%8"  # 40 tasks, 8 at once
    assert directives["cpus-per-task"] == "2" and directives["mem-per-cpu"] == "1536M"
    assert directives["time"] == "02:00:00" and directives["account"] == "llm"
    assert f"source {Path(sys.prefix) / 'bin' / 'activate'}" in script  # the nodes run this same venv
    assert f"launch_pickled_pipeline {logs / 'executor.pik'}" in script
    assert "--export=ALL,RUN_OFFSET=0" in (tmp_path / "sbatch.args").read_text()
    # What each array task loads: this pipeline, this task count; and the ranks it may run.
    with open(logs / "executor.pik", "rb") as f:
        loaded = dill.load(f)
    assert [type(step) for step in loaded.pipeline] == [JsonlReader, JsonlWriter] and loaded.world_size == 40
    assert json.loads((logs / "ranks_to_run.json").read_text()) == list(range(40))


def test_slurm_without_sbatch_says_where_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch anywhere
    resource = ExecutorResource(kind="slurm", slurm_partition="cpu")
    with pytest.raises(RuntimeError, match="sbatch is not on PATH"):
        resource.run([], logging_dir=tmp_path / "logs", tasks=1)


class RecordRuns(PipelineStep):
    """Appends "<rank>" to runs.txt each time a task runs, counts rank + 1 in its stats, and fails the rank named
    by a `fail-<rank>` file once (it removes the file), as a killed task would leave its share undone."""

    name = "record runs"

    def __init__(self, folder: str):
        super().__init__()
        self.folder = folder

    def run(self, data, rank: int = 0, world_size: int = 1):
        folder = Path(self.folder)
        with open(folder / "runs.txt", "a") as f:
            f.write(f"{rank}\n")
        if (folder / f"fail-{rank}").exists():
            (folder / f"fail-{rank}").unlink()
            raise RuntimeError(f"task {rank} killed")
        self.stat_update("weight", value=rank + 1)
        yield from data or []


def test_a_run_killed_half_way_resumes_only_the_unfinished_tasks_and_merges_every_tasks_stats(tmp_path):
    executor = ExecutorResource(kind="local", workers=1)
    (tmp_path / "fail-2").touch()
    logs = tmp_path / "logs"
    with pytest.raises(RuntimeError, match="task 2 killed"):
        executor.run([RecordRuns(str(tmp_path))], logging_dir=logs, tasks=4)
    assert (tmp_path / "runs.txt").read_text().split() == ["0", "1", "2"]  # one by one in this process: 3 never ran
    stats = json.loads(executor.run([RecordRuns(str(tmp_path))], logging_dir=logs, tasks=4).read_text())
    # Only the two unfinished tasks ran again, and the stats are those of all four (1 + 2 + 3 + 4).
    assert (tmp_path / "runs.txt").read_text().split() == ["0", "1", "2", "2", "3"]
    assert stats[0]["stats"]["weight"]["total"] == 10
    # Done: a third run runs nothing and reports the same stats.
    again = json.loads(executor.run([RecordRuns(str(tmp_path))], logging_dir=logs, tasks=4).read_text())
    assert (tmp_path / "runs.txt").read_text().split() == ["0", "1", "2", "2", "3"]
    assert again[0]["stats"]["weight"]["total"] == 10
    # Another task count shares the input differently: the folder's markers do not apply and every task runs.
    (tmp_path / "runs.txt").unlink()
    stats = json.loads(executor.run([RecordRuns(str(tmp_path))], logging_dir=logs, tasks=2).read_text())
    assert (tmp_path / "runs.txt").read_text().split() == ["0", "1"]
    assert stats[0]["stats"]["weight"]["total"] == 3


def test_the_task_count_is_the_stages_own_unless_the_resource_sets_one():
    assert ExecutorResource().tasks_for(7) == 7
    assert ExecutorResource().tasks_for(0) == 1  # a stage with no input still runs one task (it writes nothing)
    assert ExecutorResource(tasks=4).tasks_for(7) == 4
    assert ExecutorResource.from_env({"PRETRAIN_EXECUTOR_TASKS": "3"}).tasks_for(100) == 3
    with pytest.raises(ValueError, match="executor.tasks: must be >= 1"):
        ExecutorResource.from_env({"PRETRAIN_EXECUTOR_TASKS": "0"})

