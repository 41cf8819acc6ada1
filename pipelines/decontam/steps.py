"""Decontamination as datatrove tasks: the benchmark index built once and saved, the scan per task.

    index.save(work / "benchmarks.index")                               # once, in the stage's own process
    step = DecontamShards(store=store, keys=keys, index_path=work / "benchmarks.index", config=config, output_dir=out,
                          records_dir=work / "records")
    stats_path = executor.run([step], logging_dir=work / "logs" / "decontaminate", tasks=executor.tasks_for(len(keys)))
    counts, files = decontam_counts(stats_path, index.names), written_files(work / "records", keys)
    report = write_report(work / "records", keys, out / REPORT_NAME)   # every hit, parts in key order

Input parts are store keys of gzip JSON-lines parts (the dedup output's `<source>/part-*.jsonl.gz`), streamed
through the store (local folder or S3), never downloaded whole. Task `rank` of `world_size` takes the parts
rank, rank + world_size, ...; each part gives its own outputs named after it (pipelines/decontam/index.py
decontaminate_part), so the files are the same whatever the task count. The index is mapped in the task from
its file: the step pickles small (Ray and Slurm ship it to their workers).

Every hit (pipelines/decontam/index.py report_line) goes to records_dir/<part>.hits.jsonl; `write_report` joins
them, parts in key order, into the one report file of the output (REPORT_NAME), whatever the task count:
    {"part": "part-00000.jsonl.gz", "id": "doc-7", "action": "dropped", "benchmark": "mmlu_test",
     "item": "line=1234", "span": "the matched text ...", "span_chars": 312, "start": 1810, "end": 2122, "ngrams": 41}
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import orjson

from datatrove.pipeline.base import PipelineStep

from pipelines.decontam.config import DecontamConfig
from pipelines.decontam.index import BenchmarkIndex, Decontaminator, check_ngram, decontaminate_part, output_names
from pipelines.runner import stat_totals
from pipelines.shards import store_documents


class DecontamShards(PipelineStep):
    """This task's share of the input parts (store keys, every world_size-th from `rank`), each checked against
    the index saved at `index_path` (mapped in the task, once) and written under output_dir as its own outputs.
    Stats: documents_in, kept, dropped_contaminated, cut, chars_cut, spans_cut, hits_<benchmark> (documents per
    benchmark). With `records_dir`, each part's files and record counts go to
    records_dir/<part>.json as well (`written_files` gathers them), so the stage lists its output without reading
    it back, and its hits to records_dir/<part>.hits.jsonl (`write_report` joins them)."""

    name = "🧪 decontaminate"
    type = "🔻 - FILTER"

    def __init__(self, *, store, keys: list[str], index_path: str, config: DecontamConfig, output_dir: str,
                 records_dir: str | None = None):
        super().__init__()
        names = [output_names(key)[0] for key in keys]
        if len(set(names)) != len(names):
            raise ValueError(f"decontamination: two input parts have the same name; outputs are named after them: {keys}")
        self.store, self.keys, self.index_path = store, list(keys), str(index_path)
        self.config, self.output_dir = config, str(output_dir)
        self.records_dir = str(records_dir) if records_dir else None

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        mine = self.keys[rank::world_size]
        if mine:
            index = BenchmarkIndex.load(Path(self.index_path))
            check_ngram(index, self.config)
            checker = Decontaminator(index)
        for key in mine:
            with self.track_time(unit="part"):
                stats = decontaminate_part(store_documents(self.store, key), checker, self.config,
                                           Path(self.output_dir), key)
            if self.records_dir:
                record = _record_path(self.records_dir, key)
                record.parent.mkdir(parents=True, exist_ok=True)
                record.with_suffix(".hits.jsonl").write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in stats.report))
                record.write_text(json.dumps(stats.files))  # last: a part with its record has its hits written
            self.stat_update("parts", unit="part")
            for name in ("documents_in", "kept", "cut", "chars_cut", "spans_cut"):
                self.stat_update(name, value=getattr(stats, name), unit="part")
            self.stat_update("dropped_contaminated", value=stats.dropped, unit="part")
            for benchmark, n in stats.hits.items():
                self.stat_update(f"hits_{benchmark}", value=n, unit="part")
        if data:
            yield from data


def decontam_counts(stats_path: Path, benchmarks: list[str]) -> dict:
    """The asset's counts from a run's merged stats.json: in, kept, dropped by reason, cut, chars_cut, spans_cut,
    hits (documents per benchmark)."""
    totals = stat_totals(stats_path, step=DecontamShards.name)
    dropped = totals.get("dropped_contaminated", 0)
    return {"in": totals.get("documents_in", 0), "kept": totals.get("kept", 0),
            "dropped": {"contaminated": dropped} if dropped else {}, "cut": totals.get("cut", 0),
            "chars_cut": totals.get("chars_cut", 0), "spans_cut": totals.get("spans_cut", 0),
            "hits": {name: totals.get(f"hits_{name}", 0) for name in benchmarks}}


def written_files(records_dir: Path, keys: list[str]) -> list[dict]:
    """[{path, records}] of every output file the parts of `keys` gave, sorted by path (DecontamShards' records)."""
    files = []
    for key in keys:
        files += json.loads(_record_path(records_dir, key).read_text())
    return sorted(files, key=lambda f: f["path"])


REPORT_NAME = "decontamination_report.jsonl"
REPORT_FIRST = 10  # hits the summary quotes


def write_report(records_dir: Path, keys: list[str], path: Path) -> dict:
    """Join the parts' hits (DecontamShards' records, parts in key order) into the report file at `path` (written
    even when empty: no hits is an answer too). Returns its summary: {path, hits, hits_per_benchmark (hits, not
    documents), first (the first REPORT_FIRST lines)}."""
    per_benchmark: Counter = Counter()
    first: list[dict] = []
    hits = 0
    with open(path, "wb") as out:
        for key in keys:
            with open(_record_path(records_dir, key).with_suffix(".hits.jsonl"), "rb") as f:
                for line in f:
                    out.write(line)
                    hit = orjson.loads(line)
                    per_benchmark[hit["benchmark"]] += 1
                    hits += 1
                    if len(first) < REPORT_FIRST:
                        first.append(hit)
    return {"path": Path(path).name, "hits": hits, "hits_per_benchmark": dict(sorted(per_benchmark.items())),
            "first": first}


def _record_path(records_dir, key: str) -> Path:
    return Path(records_dir) / f"{output_names(key)[0].removesuffix('.jsonl.gz')}.json"
