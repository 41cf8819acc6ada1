"""Deduplication across all sources as four datatrove pipelines, in datatrove's staged MinHash shape.

    stats = deduplicate(sources=[("web", [Shard("web", "raw/web/part-00000.jsonl.gz")]), ("c4", [...])],
                        config=DedupConfig(), work_dir=Path("work"), out_dir=Path("out"), executor=executor)

writes out/<source>/part-<shard>.jsonl.gz (kept documents, input order) and out/<source>/removed-<shard>.jsonl.gz
(removed documents, with metadata.dedup_reason) for every input shard, and returns DedupStats. The algorithm is
pipelines/dedup/minhash.py's; each phase is one step (pipelines/dedup/steps.py, clusters.py) run by `executor`
(resources/executor.py's ExecutorResource, or pipelines/runner.py's LocalRunner) in its own logging folder,
work/logs/<phase>:
  1. signatures   tasks = executor.tasks_for(input shards): each task reads its own shards (streamed from the
                  store or a path, never the whole corpus) and writes per shard signatures, band keys, text
                  hashes and ids;
  2. buckets      bucket units: one per band (and key range, when a band holds more than dedup.bucket_docs
                  documents) and the exact hashes; tasks = executor.tasks_for(one per BUCKET_TASK_DOCS documents,
                  at most the input shards and the bucket units), each taking every world_size-th unit (a band
                  group). A unit's keys from every shard are sorted together: runs of equal keys are candidate
                  pairs, verified with the signatures;
  3. clusters     one task: union-find over document indices only (no text; bytes per document in
                  pipelines/dedup/clusters.py and the manifest's cluster_bytes_per_document);
  4. removal      tasks = executor.tasks_for(input shards): each task rewrites its shards.
Every file is named after its input shard or bucket, never a rank: 1 task, 4 tasks on 2 workers or Ray write the
same bytes. A phase killed half-way and run again in the same work_dir runs only its unfinished tasks (datatrove's
completion markers); a finished phase is skipped whole; a phase left by another task count starts over (a rank's
shards depend on the count). Counts come from each phase's merged stats.json.

Candidate and verified pairs are counted per band: a pair whose documents collide in three bands is checked,
and counted, in each of the three (the band tasks share nothing).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from pipelines.dedup.config import DedupConfig
from pipelines.runner import LocalRunner, stat_totals
from storage.objects import write_atomic
from pipelines.dedup.clusters import DedupClusters, DedupRemoval
from pipelines.dedup.steps import (
    DedupBuckets,
    DedupSignatures,
    Shard,
    bucket_units,
    output_names,
    unit_file,
)

# Documents per bucket task by default: a bucket phase over 250,000 documents takes about as long as starting a
# worker pool (~1-2 s on 2 cores), so smaller corpora sort their buckets in one task.
BUCKET_TASK_DOCS = 250_000


@dataclass
class DedupStats:
    documents_in: dict[str, int] = field(default_factory=dict)  # per source
    kept: dict[str, int] = field(default_factory=dict)  # per source
    removed: dict[str, int] = field(default_factory=dict)  # by reason: exact_duplicate, near_duplicate
    removed_per_source: dict[str, int] = field(default_factory=dict)
    cluster_sizes: dict[int, int] = field(default_factory=dict)  # duplicate clusters (size >= 2) by size
    candidate_pairs: int = 0  # LSH candidate pairs, counted per band
    verified_pairs: int = 0  # of those, merged after verification
    exact_pairs: int = 0  # pairs of equal text hashes
    cluster_bytes_per_document: float = 0.0  # what the clusters phase held at its peak, per document
    files: list[dict] = field(default_factory=list)  # [{"path": "web/part-00000.jsonl.gz", "records": n}, ...]

    @property
    def removed_total(self) -> int:
        return sum(self.removed.values())


def deduplicate(
    *,
    sources: Sequence[tuple[str, Sequence[Shard | Path | str]]],
    config: DedupConfig,
    work_dir: Path,
    out_dir: Path,
    executor=None,
) -> DedupStats:
    """Deduplicate the documents of all sources together; `sources` in recipe order (the keep rule uses it)."""
    names, units, work_dir, out_dir = prepare_units(sources, work_dir, out_dir)
    executor = executor or LocalRunner()

    def tasks(natural: int) -> int:
        return max(1, min(executor.tasks_for(natural), natural))

    def run(phase: str, step, tasks: int) -> Path:
        return executor.run([step], logging_dir=work_dir / "logs" / phase, tasks=tasks)

    run("signatures", DedupSignatures(units, config, work_dir), tasks(len(units)))
    index = write_unit_index(units, config, work_dir)
    buckets = bucket_units(config, index["partitions"])
    # Bucket tasks, unless the executor sets a count: one per BUCKET_TASK_DOCS documents (below that a worker
    # pool costs more than it saves), at most one per input shard and per bucket unit.
    natural = min(len(buckets), len(units), math.ceil(index["documents"] / BUCKET_TASK_DOCS))
    bucket_tasks = max(1, min(executor.tasks_for(natural), len(buckets)))
    counts = {"buckets": run("buckets", DedupBuckets(buckets, config, work_dir), bucket_tasks)}
    counts["clusters"] = run("clusters", DedupClusters(names, buckets, work_dir), 1)
    counts["removal"] = run("removal", DedupRemoval(units, work_dir, out_dir), tasks(len(units)))
    totals = {phase: stat_totals(path) for phase, path in counts.items()}
    return dedup_stats(names, units, work_dir, totals, index["documents"])


def prepare_units(sources: Sequence[tuple[str, Sequence[Shard | Path | str]]], work_dir: Path,
                  out_dir: Path) -> tuple[list[str], list[Shard], Path, Path]:
    """(source names, input units, work_dir, out_dir) of a dedup run, either rule's: names unique, every unit's
    outputs named apart, both folders made."""
    names = [name for name, _ in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"dedup: source names must be unique, got {names}")
    units = [p if isinstance(p, Shard) else Shard(name, str(p)) for name, paths in sources for p in paths]
    _check_unique_outputs(units)
    work_dir, out_dir = Path(work_dir), Path(out_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    return names, units, work_dir, out_dir


def _check_unique_outputs(units: list[Shard]) -> None:
    seen: dict[str, Shard] = {}
    for shard in units:
        name = output_names(shard)[0]
        if name in seen:
            raise ValueError(f"dedup: input shards {seen[name].path!r} and {shard.path!r} of source {shard.source!r} "
                             f"would both write {name}; give the shards distinct file names")
        seen[name] = shard


def write_unit_index(units: list[Shard], config: DedupConfig, work_dir: Path) -> dict:
    """units.json from the signature phase's per-unit records: document counts, offsets, bucket key ranges."""
    rows, offset = [], 0
    for unit, shard in enumerate(units):
        path = unit_file(work_dir, "signatures", unit, ".json")
        if not path.is_file():
            raise FileNotFoundError(f"dedup: {path} is missing: the signature phase did not write {shard.path}")
        record = json.loads(path.read_text())
        if record["shard"] != str(shard.path):
            raise ValueError(f"dedup: {path} is for {record['shard']}, not {shard.path}: a stale work folder")
        rows.append({"source": shard.source, "shard": str(shard.path), "documents": record["documents"], "offset": offset})
        offset += record["documents"]
    index = {"documents": offset, "partitions": max(1, math.ceil(offset / config.bucket_docs)), "units": rows}
    write_atomic(work_dir / "units.json", [json.dumps(index).encode()])
    return index


def dedup_stats(names: list[str], units: list[Shard], work_dir: Path, totals: dict[str, Counter],
                documents: int) -> DedupStats:
    """DedupStats from the phases' merged stats and the removal phase's file lists (either rule's)."""
    removal, clusters, buckets = totals["removal"], totals["clusters"], totals["buckets"]
    stats = DedupStats(
        documents_in={name: int(removal[f"documents_in:{name}"]) for name in names},
        kept={name: int(removal[f"kept:{name}"]) for name in names},
        removed_per_source={name: int(removal[f"removed:{name}"]) for name in names},
        removed={key.removeprefix("removed_"): int(n) for key, n in sorted(removal.items())
                 if key.startswith("removed_") and n},
        cluster_sizes={int(key.rsplit("_", 1)[1]): int(n) for key, n in clusters.items()
                       if key.startswith("clusters_of_size_")},
        candidate_pairs=int(buckets["candidate_pairs"]),
        verified_pairs=int(buckets["verified_pairs"]),
        exact_pairs=int(buckets["exact_pairs"]),
        cluster_bytes_per_document=round(clusters["held_bytes"] / documents, 1) if documents else 0.0,
    )
    stats.cluster_sizes = dict(sorted(stats.cluster_sizes.items()))
    for unit in range(len(units)):
        path = unit_file(work_dir, "removal", unit, ".json")
        if not path.is_file():
            raise FileNotFoundError(f"dedup: {path} is missing: the removal phase did not write {units[unit].path}")
        stats.files += json.loads(path.read_text())["files"]
    if sum(stats.documents_in.values()) != documents:
        raise RuntimeError(f"dedup: the removal phase read {sum(stats.documents_in.values())} documents, the signature "
                           f"phase {documents}: an input shard changed during the stage")
    return stats
