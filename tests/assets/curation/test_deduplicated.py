"""raw_crawl -> deduplicated -> decontaminated through `pretrain materialize`, on a copy of the demo recipe.

Two sources: the demo's `c4` (real C4/Dolma pages) and `mirror`, real pages of a second crawl in which one C4
page reappears with small edits, one appears twice, and one carries a real GSM8K test problem.
"""

import gzip
import json
import random
import re

import orjson
import pytest
import yaml
from dagster import AssetKey, AssetSelection, DagsterInstance

from assets.cli import main
from assets.definitions import build_defs, build_resources
from assets.recipe import DEMO_RECIPE, load_recipe


def write_recipe(path, mirror_file, mutate=lambda raw: None):
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    raw["base_dir"] = str((DEMO_RECIPE.parent / raw["base_dir"]).resolve())
    c4 = next(s for s in raw["sources"] if s["name"] == "c4")
    c4.pop("filter", None)  # its block lists live beside the demo recipe, not beside this copy
    raw["sources"] = [c4, {"name": "mirror", "format": "jsonl", "inputs": [str(mirror_file)]}]
    # Two benchmark files keep the index small; the demo's list is exercised by the engine tests.
    raw["decontamination"]["benchmarks"] = ["benchmarks/gsm8k_test.jsonl", "benchmarks/HumanEval.jsonl.gz"]
    raw.pop("quality_classifier", None)  # trained on the demo's `web` source, which this copy leaves out
    for section in ("mixing", "training", "ablation"):  # they name the demo's sources
        raw.pop(section, None)
    mutate(raw)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def make_mirror(path, shared_data) -> dict:
    c4 = [json.loads(line) for f in sorted((shared_data / "jsonl").glob("*.json*.gz")) for line in gzip.open(f)]
    c4_long = [d for d in c4 if len(d["text"].split()) >= 400]
    pages = [json.loads(line)["text"] for line in open(shared_data / "quality" / "dclm_majority_data.jsonl")][:41]
    question = json.loads(open(shared_data / "benchmarks" / "gsm8k_test.jsonl").readline())["question"]

    rng = random.Random(0)
    words = c4_long[0]["text"].split(" ")
    for _ in range(3):
        words[rng.randrange(len(words))] = "updated"
    planted = {
        "near_copy": " ".join(words) + "\nShare this page.",
        "m005-copy": pages[5],  # sorts after m005, so the first one is kept
        "contaminated": pages[40] + "\n\nToday's puzzle: " + question + "\n\nPost your answer below.",
    }
    rows = [{"id": f"m{i:03d}", "text": text} for i, text in enumerate(pages[:40])]
    rows += [{"id": name, "text": text} for name, text in planted.items()]
    path.write_text("".join(orjson.dumps(row).decode() + "\n" for row in rows))
    return {"near_copy_of": c4_long[0]["id"], "pages": len(rows)}


def metadata(key: str) -> dict:
    event = DagsterInstance.get().get_latest_materialization_event(AssetKey(key.split("/")))
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def read_docs(store, prefix, path) -> list[dict]:
    return [orjson.loads(line) for line in gzip.decompress(store.get_bytes(f"{prefix}/{path}")).splitlines() if line]


def read_all(store, prefix, path_prefix) -> list[dict]:
    """The documents of every file of the output whose path starts with `path_prefix`, in manifest order."""
    manifest = json.loads(store.get_bytes(f"{prefix}/manifest.json"))
    return [doc for f in manifest["files"] if f["path"].startswith(path_prefix) for doc in read_docs(store, prefix, f["path"])]


def status(capsys) -> dict[str, str]:
    capsys.readouterr()
    assert main(["status"]) == 0
    return {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()}


def decontaminated_and_upstream(recipe) -> list[str]:
    """What `decontaminated` needs, whichever stage dedup reads from: raw_crawl -> (filtered ->) dedup -> it."""
    graph = build_defs(load_recipe(recipe)).resolve_asset_graph()
    wanted = AssetSelection.assets(*[AssetKey(["curation", s, "decontaminated"]) for s in ("c4", "mirror")])
    return sorted(key.to_user_string() for key in wanted.upstream().resolve(graph))


@pytest.mark.slow  # ~10-20 s: two materializations of five assets
def test_dedup_and_decontamination_assets_end_to_end(tmp_path, monkeypatch, capsys, shared_data):
    mirror = tmp_path / "mirror.jsonl"
    facts = make_mirror(mirror, shared_data)
    recipe = tmp_path / "recipe.yaml"
    write_recipe(recipe, mirror)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))

    keys = decontaminated_and_upstream(recipe)
    assert {"curation/c4/raw_crawl", "curation/deduplicated", "curation/mirror/decontaminated"} <= set(keys)
    assert main(["materialize", "--select", ",".join(keys)]) == 0
    assert {status(capsys)[key] for key in keys} == {"fresh"}

    dedup = metadata("curation/deduplicated")
    assert dedup["removed_by_reason"] == {"exact_duplicate": 1, "near_duplicate": 1}
    assert dedup["removed"] == 2 and dedup["cluster_size_histogram"] == {"2": 2}
    assert dedup["cluster_bytes_per_document"] > 0  # measured in the clusters phase
    per_source = dedup["per_source_counts"]
    assert per_source["c4"]["removed"] == 0 and per_source["c4"]["kept"] == per_source["c4"]["in"] > 0
    assert per_source["mirror"]["removed"] == 2 and per_source["mirror"]["kept"] == per_source["mirror"]["in"] - 2

    store = build_resources()["store"].open()
    removed = read_all(store, dedup["prefix"], "mirror/removed-")
    near = next(d for d in removed if d["id"] == "near_copy")
    assert near["metadata"]["dup_cluster"] == f"c4/{facts['near_copy_of']}"  # across sources, the c4 page stays
    assert {d["id"] for d in removed} == {"near_copy", "m005-copy"}

    clean = metadata("curation/c4/decontaminated")
    dirty = metadata("curation/mirror/decontaminated")
    assert clean["dropped"] == 0 and clean["documents"] == per_source["c4"]["kept"]
    assert dirty["dropped"] == 1 and dirty["hits_per_benchmark"] == {"gsm8k_test": 1, "HumanEval": 0}
    assert [d["id"] for d in read_all(store, dirty["prefix"], "removed")] == ["contaminated"]
    # Clean documents pass both stages unchanged (dedup adds cluster ids only to cluster members).
    deduped_c4 = read_all(store, dedup["prefix"], "c4/part-")
    assert read_all(store, clean["prefix"], "part-") == deduped_c4

    # The CLI reads the per-source stage by name.
    capsys.readouterr()
    assert main(["docs", "decontaminated", "--source", "mirror", "--limit", "2"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == ["m000", "m001"]

    # Materialized again with nothing changed: the committed output is reused, same version and data.
    assert main(["materialize", "--select", "curation/deduplicated"]) == 0
    again = metadata("curation/deduplicated")
    assert (again["version_key"], again["data_version"]) == (dedup["version_key"], dedup["data_version"])

    # A dedup setting changes: the dedup stage is stale (and its children once it reruns); raw_crawl is not.
    write_recipe(recipe, mirror, lambda raw: raw["dedup"].update(bands=12, rows=9))
    states = status(capsys)
    assert states["curation/deduplicated"] == "stale"
    assert states["curation/c4/raw_crawl"] == states["curation/mirror/raw_crawl"] == "fresh"
    raw_runs = len(DagsterInstance.get().fetch_materializations(AssetKey(["curation", "c4", "raw_crawl"]), limit=10).records)
    assert main(["materialize", "--stale", "--select", ",".join(keys)]) == 0
    assert {status(capsys)[key] for key in keys} == {"fresh"}
    assert len(DagsterInstance.get().fetch_materializations(AssetKey(["curation", "c4", "raw_crawl"]), limit=10).records) == raw_runs
    assert metadata("curation/deduplicated")["version_key"] != dedup["version_key"]


@pytest.mark.slow  # materializes assets through the CLI
def test_the_stages_write_nested_source_parts_to_s3(tmp_path, monkeypatch, capsys, s3, shared_data):
    """deduplicated keeps one folder per source (`c4/part-<shard>.jsonl.gz`), its tasks streaming their shards
    from S3; the same code on the S3 backend."""
    mirror = tmp_path / "mirror.jsonl"
    make_mirror(mirror, shared_data)
    recipe = tmp_path / "recipe.yaml"
    write_recipe(recipe, mirror)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    monkeypatch.setenv("PRETRAIN_STORE", f"s3://{s3.bucket}/factory")

    assert main(["materialize", "--select", ",".join(decontaminated_and_upstream(recipe))]) == 0
    dedup = metadata("curation/deduplicated")
    keys = {obj["Key"] for obj in s3.client().list_objects_v2(Bucket=s3.bucket)["Contents"]}
    prefix = f"factory/{dedup['prefix']}"
    assert f"{prefix}/manifest.json" in keys
    assert {key.rsplit("/", 2)[-2] + "/" + key.rsplit("/", 1)[-1].split("-")[0] for key in keys
            if key.startswith(prefix + "/") and key.endswith(".jsonl.gz")} == {"c4/part", "mirror/part", "mirror/removed"}
    capsys.readouterr()
    assert main(["docs", "decontaminated", "--source", "c4", "--limit", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["metadata"]["source"] == "c4"


@pytest.mark.slow  # materializes raw_crawl and filtered of two sources, then deduplicated twice
def test_a_killed_dedup_materialized_again_runs_only_the_unfinished_tasks(tmp_path, monkeypatch, capfd, shared_data):
    from pipelines.dedup.clusters import DedupRemoval
    from pipelines.dedup.stage import deduplicate
    from pipelines.runner import LocalRunner
    from pipelines.dedup.steps import Shard

    mirror = tmp_path / "mirror.jsonl"
    make_mirror(mirror, shared_data)
    recipe = tmp_path / "recipe.yaml"
    write_recipe(recipe, mirror)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    monkeypatch.setenv("PRETRAIN_EXECUTOR_TASKS", "4")
    upstream = [k for k in decontaminated_and_upstream(recipe) if k.split("/")[-1] in ("raw_crawl", "filtered")]
    assert main(["materialize", "--jobs", "1", "--select", ",".join(upstream)]) == 0

    # Removal task 2 dies the first time, after tasks 0 and 1 completed (one local worker runs them in order).
    marker, real_unit = tmp_path / "killed.marker", DedupRemoval._unit

    def dying(self, unit):
        if unit == 2 and not marker.exists():
            marker.touch()
            raise RuntimeError("removal task killed")
        return real_unit(self, unit)

    monkeypatch.setattr(DedupRemoval, "_unit", dying)
    assert main(["materialize", "--jobs", "1", "--select", "curation/deduplicated"]) != 0
    capfd.readouterr()
    # --verbose: the executor's own lines stream to the terminal (without it they go to the command's log file).
    assert main(["materialize", "--verbose", "--jobs", "1", "--select", "curation/deduplicated"]) == 0
    err = capfd.readouterr().err
    # The executor skipped every completed task: the first three phases whole, two of the four removal tasks.
    for phase in ("signatures", "buckets", "clusters"):
        assert re.search(rf"(\d+) of \1 tasks already completed in \S+/logs/{phase}\b", err), phase
    assert re.search(r"2 of 4 tasks already completed in \S+/logs/removal; running the other 2", err)

    # The committed output is what one uninterrupted run writes.
    dedup = metadata("curation/deduplicated")
    store = build_resources()["store"].open()
    manifest = json.loads(store.get_bytes(f"{dedup['prefix']}/manifest.json"))
    sources = []
    for name in ("c4", "mirror"):
        filtered = json.loads(store.get_bytes(f"{metadata(f'curation/{name}/filtered')['prefix']}/manifest.json"))
        prefix = metadata(f"curation/{name}/filtered")["prefix"]
        sources.append((name, [Shard(name, f"{prefix}/{f['path']}", store) for f in filtered["files"]
                               if f["path"].startswith("part-")]))
    stats = deduplicate(sources=sources, config=load_recipe(recipe).dedup, work_dir=tmp_path / "again",
                        out_dir=tmp_path / "again" / "out", executor=LocalRunner(workers=1, tasks=1))
    again = {p.relative_to(tmp_path / "again" / "out").as_posix(): p.read_bytes()
             for p in sorted((tmp_path / "again" / "out").rglob("*.jsonl.gz"))}
    assert {f["path"] for f in manifest["files"]} == set(again)
    for f in manifest["files"]:
        assert store.get_bytes(f"{dedup['prefix']}/{f['path']}") == again[f["path"]], f["path"]
    assert manifest["counts"]["kept"] == sum(stats.kept.values()) and manifest["counts"]["dropped"] == stats.removed
