"""A crawl that grows dump by dump (assets/dumps.py): real documents split into four dumps, three
materialized, then the fourth added. Only the fourth dump's partitions run, the kept documents equal one sequential
run over all four, the earlier dumps' outputs keep their data versions; a filter change makes stale the crawl's
partitions and what is downstream of them, nothing of the other source; a new dump folder on S3 becomes a partition
on the dump sensor's next tick."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import pytest
import yaml
from dagster import AssetKey, DagsterInstance, build_sensor_context

from assets.cli import main
from tests.assets.test_cli import status_rows

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
DUMPS = ["2024-10", "2024-18", "2024-22", "2024-26"]
CRAWL_ASSETS = ["curation/crawl/raw_crawl", "curation/crawl/filtered", "curation/crawl/deduplicated",
                "curation/crawl/decontaminated", "tokenization/crawl/packed"]


def real_documents() -> list[dict]:
    """Real web pages: DCLM's labelled sample, then C4 and Dolma documents; those of 50 words or more, each once."""
    texts = [json.loads(line)["text"] for line in open(DATA / "quality" / "dclm_majority_data.jsonl")]
    for path in sorted((DATA / "jsonl").glob("*.json*.gz")):
        texts += [json.loads(line)["text"] for line in gzip.open(path)]
    return [{"text": t} for t in dict.fromkeys(texts) if len(t.split()) >= 50]


def write_part(path: Path, docs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as f:
        for doc in docs:
            f.write(orjson.dumps({"text": doc["text"], "id": doc["id"]}) + b"\n")


def near_copy(doc: dict, new_id: str) -> dict:
    """The document with one word in fifty replaced: Jaccard of its 5-word shingles well above 0.8."""
    words = doc["text"].split()
    for i in range(0, len(words), 50):
        words[i] = "zzyzx"
    return {"text": " ".join(words), "id": new_id}


@pytest.fixture
def crawl(tmp_path) -> dict:
    """news: one plain source; crawl: four dumps of distinct real documents, with duplicates planted: within a dump,
    across dumps (exact and near), and of the news source."""
    docs = real_documents()
    news = [{"text": d["text"], "id": f"news-{i}"} for i, d in enumerate(docs[:40])]
    per_dump = 60
    dumps = {}
    for k, dump in enumerate(DUMPS):
        start = 40 + k * per_dump
        dumps[dump] = [{"text": d["text"], "id": f"{dump}-{i}"} for i, d in enumerate(docs[start:start + per_dump])]
    d1, d2, d3, d4 = (dumps[d] for d in DUMPS)
    d1.append(near_copy(d1[0], f"{DUMPS[0]}-near"))  # within a dump
    d2.append({**news[3], "id": f"{DUMPS[1]}-news"})  # of the other source
    d3.append({**d1[5], "id": f"{DUMPS[2]}-exact"})  # of an earlier dump, exact
    d3.append(near_copy(d2[9], f"{DUMPS[2]}-near-{DUMPS[1]}"))  # of the dump just before
    d4 += [near_copy(d2[7], f"{DUMPS[3]}-near"), {**d3[2], "id": f"{DUMPS[3]}-exact"}]
    write_part(tmp_path / "news" / "news.jsonl.gz", news)
    for dump in DUMPS[:3]:
        write_part(tmp_path / "crawl" / dump / f"{dump}.jsonl.gz", dumps[dump])
    recipe = tmp_path / "recipe.yaml"
    raw = {"name": "growing", "sources": [
        {"name": "news", "format": "jsonl", "inputs": [str(tmp_path / "news" / "*.jsonl.gz")]},
        {"name": "crawl", "format": "jsonl", "inputs": [str(tmp_path / "crawl" / "{dump}" / "*.jsonl.gz")],
         # Lenient on alphabetic words (datatrove counts punctuation as words), so the planted copies' originals stay.
         "filter": {"gopher_quality": {"min_doc_words": 50, "max_non_alpha_words_ratio": 0.5}}}],
        "dedup": {"rule": "sequential"},
        "tokenizer": {"vocab_size": 512, "sample_bytes": 200_000}}
    recipe.write_text(yaml.safe_dump(raw))
    return {"root": tmp_path, "recipe": recipe, "raw": raw, "dumps": dumps, "news": news}


def partition_versions(keys: list[str]) -> dict:
    """{(asset, dump): data version of its latest materialization}."""
    instance = DagsterInstance.get()
    found = {}
    for key in keys:
        for record in instance.fetch_materializations(AssetKey.from_user_string(key), limit=1000).records:
            ident = (key, record.partition_key)
            if ident not in found:  # newest first
                found[ident] = record.asset_materialization.tags["dagster/data_version"]
    return found


def all_materializations() -> list[tuple[str, str | None]]:
    from dagster import DagsterEventType, EventRecordsFilter

    instance = DagsterInstance.get()
    records = instance.get_event_records(EventRecordsFilter(event_type=DagsterEventType.ASSET_MATERIALIZATION),
                                         limit=10_000)
    return sorted((r.asset_key.to_user_string(), r.partition_key) for r in records)


def kept_ids(store_root: Path) -> set[str]:
    """Every document id in the news' and the crawl's deduplicated outputs (one version each here), from the store."""
    ids = set()
    for manifest_path in store_root.glob("curation/**/deduplicated/**/manifest.json"):
        folder = manifest_path.parent
        for entry in json.loads(manifest_path.read_text())["files"]:
            if "/part-" in entry["path"] and entry["path"].endswith(".jsonl.gz"):
                ids.update(json.loads(line)["id"] for line in gzip.open(folder / entry["path"]))
    return ids


@pytest.mark.slow
def test_a_new_dump_builds_only_its_partitions_and_keeps_what_was_kept(crawl, monkeypatch, capsys, pretrain_home):
    monkeypatch.setenv("PRETRAIN_RECIPE", str(crawl["recipe"]))
    select = "+tokenization/*/packed"
    assert main(["materialize", "--stale", "--select", select]) == 0
    rows = status_rows(capsys)
    for key in CRAWL_ASSETS:
        for dump in DUMPS[:3]:
            assert rows[f"{key}[{dump}]"] == ("fresh", "-"), (key, dump, rows)
    before = partition_versions(CRAWL_ASSETS + ["curation/deduplicated", "tokenization/tokenizer"])
    runs_before = all_materializations()

    # The fourth dump's folder appears: `pretrain status` finds it, and --stale builds its partitions only.
    dumps = crawl["dumps"]
    write_part(crawl["root"] / "crawl" / DUMPS[3] / f"{DUMPS[3]}.jsonl.gz", dumps[DUMPS[3]])
    rows = status_rows(capsys)
    assert rows[f"curation/crawl/raw_crawl[{DUMPS[3]}]"][0] == "missing"
    assert rows["curation/news/filtered"] == ("fresh", "-")
    assert main(["materialize", "--stale", "--select", select]) == 0
    new_runs = list(all_materializations())
    for run in runs_before:
        new_runs.remove(run)
    assert sorted(new_runs) == sorted((key, DUMPS[3]) for key in CRAWL_ASSETS), new_runs
    after = partition_versions(CRAWL_ASSETS + ["curation/deduplicated", "tokenization/tokenizer"])
    assert {k: v for k, v in after.items() if k[1] != DUMPS[3]} == before  # nothing earlier changed
    rows = status_rows(capsys)
    assert all(state == "fresh" for key, (state, _) in rows.items() if "tokenization" in key or "curation" in key), rows

    # The kept documents equal one sequential run over the news source and all four dumps, in order.
    from pipelines.dedup.config import DedupConfig
    from pipelines.dedup.sequential import deduplicate_sequential
    from pipelines.dedup.steps import Shard

    store = pretrain_home / "store"
    one_run = pretrain_home / "one-run"
    filtered = {}
    for key in ("curation/news/filtered", "curation/crawl/filtered"):
        for manifest_path in sorted(store.glob(f"{key}/**/manifest.json")):
            part = manifest_path.parent
            dump = part.parent.name if key.startswith("curation/crawl") else None
            for entry in json.loads(manifest_path.read_text())["files"]:
                if entry["path"].startswith("part-"):
                    # Each dump's parts are numbered from 0: linked under the dump's name, so one run can hold all.
                    link = one_run / "in" / f"{dump or 'news'}-{entry['path']}"
                    link.parent.mkdir(parents=True, exist_ok=True)
                    link.symlink_to(part / entry["path"])
                    filtered.setdefault(dump, []).append(Shard("news" if dump is None else "crawl", str(link)))
    stats = deduplicate_sequential(sources=[("news", filtered[None]),
                                            ("crawl", [s for d in DUMPS for s in filtered[d]])],
                                   earlier=[], config=DedupConfig(rule="sequential"), work_dir=one_run / "work",
                                   out_dir=one_run / "out")
    expected = set()
    for entry in stats.files:
        if "/part-" in entry["path"]:
            expected.update(json.loads(line)["id"] for line in gzip.open(one_run / "out" / entry["path"]))
    assert kept_ids(store) == expected
    planted = {f"{DUMPS[0]}-near", f"{DUMPS[1]}-news", f"{DUMPS[2]}-exact", f"{DUMPS[3]}-near", f"{DUMPS[3]}-exact",
               f"{DUMPS[2]}-near-{DUMPS[1]}"}
    assert not planted & expected, planted & expected  # every planted duplicate went

    # `where` and `docs` name a dump as status prints it, or take every dump, in order.
    key = "curation/crawl/deduplicated"
    assert main(["where", key]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == DUMPS
    assert all(f"/{key}/{dump}/" in line for dump, line in zip(DUMPS, lines)), lines
    assert main(["where", f"{key}[{DUMPS[3]}]"]) == 0
    uri, manifest = capsys.readouterr().out.split("\n", 1)
    assert f"/{key}/{DUMPS[3]}/" in uri and json.loads(manifest)["files"]
    crawl_ids = {doc_id for doc_id in expected if not doc_id.startswith("news")}
    assert main(["docs", key]) == 0
    streamed = [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()]
    assert sorted(streamed) == sorted(crawl_ids)  # the kept documents (part-*), not the removed ones
    assert main(["docs", f"{key}[{DUMPS[1]}]"]) == 0
    one = {json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()}
    assert one and one < crawl_ids and all(doc_id.startswith(DUMPS[1]) for doc_id in one), one
    assert main(["docs", f"{key}[1999-01]"]) == 2
    assert f"has no dump '1999-01'; its dumps are: {', '.join(DUMPS)}" in capsys.readouterr().err
    assert main(["where", "curation/news/filtered[2024-10]"]) == 2
    assert "is not partitioned by dump" in capsys.readouterr().err


@pytest.mark.slow
def test_a_filter_change_on_the_crawl_makes_its_partitions_stale_and_nothing_else(crawl, monkeypatch, capsys):
    """Staleness shows one step at a time (a child turns stale once its parent is built again): the crawl's filtered
    dumps first; then --stale rebuilds the crawl's partitions down to its packed shards, and nothing of the news
    source, the global dedup or the tokenizer."""
    monkeypatch.setenv("PRETRAIN_RECIPE", str(crawl["recipe"]))
    assert main(["materialize", "--stale", "--select", "+tokenization/*/packed"]) == 0
    runs_before = all_materializations()
    raw = crawl["raw"]
    raw["sources"][1]["filter"]["gopher_quality"]["min_doc_words"] = 80
    crawl["recipe"].write_text(yaml.safe_dump(raw))
    rows = status_rows(capsys)
    stale = sorted(key for key, (state, _) in rows.items() if state != "fresh")
    assert stale == ["curation/crawl/filtered", *(f"curation/crawl/filtered[{d}]" for d in DUMPS[:3])], stale
    assert main(["materialize", "--stale", "--select", "+tokenization/*/packed"]) == 0
    new_runs = all_materializations()
    for run in runs_before:
        new_runs.remove(run)
    assert sorted(new_runs) == sorted((key, d) for key in CRAWL_ASSETS[1:] for d in DUMPS[:3]), new_runs
    assert all(state == "fresh" for state, _ in status_rows(capsys).values())


def test_the_dump_sensor_adds_a_new_s3_dump_folder_on_its_next_tick(tmp_path, s3, monkeypatch):
    """The crawl is on the moto S3 server: a new dump folder under its prefix is a new partition on the next tick;
    a tick with nothing new adds nothing."""
    from assets.cli.factory import open_instance
    from assets.dumps import dump_sensors, dumps_partitions
    from assets.recipe import load_recipe

    bucket, client = s3.bucket, s3.client()
    doc = orjson.dumps({"text": "a document of the crawl", "id": "x"}) + b"\n"
    for dump in DUMPS[:2]:
        client.put_object(Bucket=bucket, Key=f"crawl/{dump}/part-0.jsonl", Body=doc)
    recipe_path = tmp_path / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump({"name": "s3crawl", "dedup": {"rule": "sequential"}, "sources": [
        {"name": "crawl", "format": "jsonl", "inputs": [f"s3://{bucket}/crawl/{{dump}}/*.jsonl"]}]}))
    recipe = load_recipe(recipe_path)
    [sensor] = dump_sensors(recipe)
    partitions = dumps_partitions(recipe.sources[0])
    instance = open_instance()

    def tick() -> list[str]:
        result = sensor(build_sensor_context(instance=instance))
        added = [key for request in result.dynamic_partitions_requests for key in request.partition_keys]
        if added:  # what the daemon does with the tick's requests
            instance.add_dynamic_partitions(partitions.name, added)
        return added

    assert tick() == DUMPS[:2]
    assert tick() == []
    client.put_object(Bucket=bucket, Key=f"crawl/{DUMPS[2]}/part-0.jsonl", Body=doc)
    assert tick() == [DUMPS[2]]
    assert sorted(instance.get_dynamic_partitions(partitions.name)) == DUMPS[:3]


@pytest.mark.slow
def test_training_reads_every_dump_and_names_each_in_its_lineage(crawl, monkeypatch, capsys):
    """training/main reads the crawl's dumps as one source: its lineage names each packed partition, a new dump
    makes it stale (and only the new dump's partitions and the stage run), and the crawl's epochs fall as its tokens
    grow."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    raw = crawl["raw"]
    raw["training"] = {"main": {
        "train_tokens": 6 * 8 * 64, "model": {"vocab_size": 512, "d_model": 32, "n_layers": 1, "n_heads": 2},
        "batch": {"global_batch": 8, "micro_batch": 8, "seq_len": 64, "ramp_start": None, "ramp_tokens": 0},
        "optim": {"lr": 3e-3}, "deepspeed": {"zero_stage": 1, "bf16": "auto"},
        "metrics": {"log_interval": 1, "eval_batches": 1, "tensorboard": False},
        "checkpoint": {"interval_steps": 3, "keep_last": 1}}}
    crawl["recipe"].write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("PRETRAIN_RECIPE", str(crawl["recipe"]))
    assert main(["materialize", "--stale", "--select", "+training/main"]) == 0

    def stage() -> dict:
        event = DagsterInstance.get().get_latest_materialization_event(AssetKey.from_user_string("training/main"))
        meta = {k: v.value for k, v in event.asset_materialization.metadata.items()}
        prefix = meta["prefix"]
        store = Path(DagsterInstance.get().root_directory).parent / "store"
        return {**meta, "manifest": json.loads((store / prefix / "manifest.json").read_text())}

    first = stage()
    packed = sorted(r["partition"] for r in first["manifest"]["lineage"] if r["asset"] == "tokenization/crawl/packed")
    assert packed == DUMPS[:3]
    # Through each dump's chain down to its raw partition, and the news source's, once each.
    raws = sorted(r.get("partition") or "-" for r in first["manifest"]["lineage"] if r["asset"].endswith("raw_crawl"))
    assert raws == ["-", *DUMPS[:3]], raws

    write_part(crawl["root"] / "crawl" / DUMPS[3] / f"{DUMPS[3]}.jsonl.gz", crawl["dumps"][DUMPS[3]])
    runs_before = all_materializations()
    assert main(["materialize", "--stale", "--select", "+training/main"]) == 0
    new_runs = all_materializations()
    for run in runs_before:
        new_runs.remove(run)
    assert sorted(new_runs) == sorted([(key, DUMPS[3]) for key in CRAWL_ASSETS] + [("training/main", None)])
    second = stage()
    packed = sorted(r["partition"] for r in second["manifest"]["lineage"] if r["asset"] == "tokenization/crawl/packed")
    assert packed == DUMPS
    assert second["epochs"]["crawl"] < first["epochs"]["crawl"]  # the same draws over more tokens
    assert second["epochs"]["news"] == first["epochs"]["news"]


@pytest.mark.slow
def test_a_dump_that_sorts_before_built_ones_makes_the_later_dumps_dedup_again(crawl, monkeypatch, capsys):
    """A backfilled dump: 2024-18 arrives after 2024-10 and 2024-22 were built. Dumps are deduplicated in name order,
    so --stale builds 2024-18's part and then 2024-22's again, against 2024-18's index. And when an earlier dump's part
    is built after a later one's, status calls the later one stale (Dagster does not know that dependency)."""
    import shutil

    from assets.definitions import build_defs
    from assets.recipe import load_recipe

    late = crawl["root"] / "crawl" / DUMPS[1]
    shutil.move(late, crawl["root"] / "held-back")
    monkeypatch.setenv("PRETRAIN_RECIPE", str(crawl["recipe"]))
    key = "curation/crawl/deduplicated"
    assert main(["materialize", "--stale", "--select", f"+{key}"]) == 0
    before = partition_versions([key])
    shutil.move(crawl["root"] / "held-back", late)
    assert main(["materialize", "--stale", "--select", f"+{key}"]) == 0
    after = partition_versions([key])
    assert after[(key, DUMPS[0])] == before[(key, DUMPS[0])]
    assert after[(key, DUMPS[2])] != before[(key, DUMPS[2])]  # built again against 2024-18's index:
    store = Path(DagsterInstance.get().root_directory).parent / "store"
    removed = set()
    for manifest_path in store.glob(f"{key}/{DUMPS[2]}/*/manifest.json"):
        for entry in json.loads(manifest_path.read_text())["files"]:
            if "/removed-" in entry["path"]:
                removed |= {(manifest_path.parent.name, json.loads(line)["id"])
                            for line in gzip.open(manifest_path.parent / entry["path"])}
    # The copy of a 2024-18 page was kept while 2024-18 was not there, and goes once it is.
    assert sum(doc == f"{DUMPS[2]}-near-{DUMPS[1]}" for _, doc in removed) == 1
    rows = status_rows(capsys)
    assert all(rows[f"{key}[{d}]"] == ("fresh", "-") for d in DUMPS[:3]), rows
    event = DagsterInstance.get().fetch_materializations(AssetKey.from_user_string(key), limit=1).records[0]
    assert event.partition_key == DUMPS[2]

    # 2024-18's part built once more (reused: the same data version), now after 2024-22's.
    instance = DagsterInstance.get()
    job = build_defs(load_recipe()).resolve_implicit_global_asset_job_def()
    assert job.execute_in_process(instance=instance, asset_selection=[AssetKey.from_user_string(key)],
                                  partition_key=DUMPS[1]).success
    state, cause = status_rows(capsys)[f"{key}[{DUMPS[2]}]"]
    assert state == "stale" and DUMPS[1] in cause, cause
    assert main(["materialize", "--stale", "--select", f"+{key}"]) == 0
    assert status_rows(capsys)[f"{key}[{DUMPS[2]}]"] == ("fresh", "-")
    assert partition_versions([key])[(key, DUMPS[2])] == after[(key, DUMPS[2])]  # its inputs had not changed
