"""Sequential deduplication: one part of a corpus that grows part by part (a crawl's dumps) against the index of what
the parts before it kept, so that no kept document of an earlier part ever changes.

    stats = deduplicate_sequential(sources=[("crawl", [Shard(...), ...]), ("news", [...])],
                                   earlier=[IndexPart(store, "<prefix of dump 1's output>", "crawl/2024-10")],
                                   config=DedupConfig(rule="sequential"), work_dir=work, out_dir=out, executor=executor)

The rule: documents are taken in corpus order (the earlier parts first; in a part, sources in the given order,
shards in order, lines in order); a document is removed when it matches an earlier KEPT document, else kept. Match:
the same text hash (dedup.exact), or an equal key in a band and an estimated Jaccard >= verify_threshold (dedup.near;
0 = no verification). Unlike the transitive rule (stage.py), a document that matches only a removed one stays:
A ~ B ~ C with A !~ C keeps A and C. out_dir is written as deduplicate() writes it: <source>/part-<shard>.jsonl.gz
(every kept document as the same bytes, in input order) and <source>/removed-<shard>.jsonl.gz (metadata.dedup_reason,
and metadata.dup_of: "<source>/<id>" of the earliest kept document it matched, here or in an earlier part); plus
out_dir/index/ (pipelines/dedup/index.py) for the parts after it. The caller commits out_dir whole.

Five phases on the executor, each in work/logs/<phase>, resumable as stage.py's (datatrove's completion markers):
  1. signatures  tasks = executor.tasks_for(input shards): DedupSignatures (pipelines/dedup/steps.py);
  2. match       IndexMatch (index.py): one unit for the text hashes and one per band (dedup.near), tasks as
                 stage.py's buckets. The part's keys sorted together give its runs of equal keys
                 (match/<unit>.runs.npy: [run, document]); every earlier part's sorted keys are searched
                 (np.searchsorted) for the keys that no part before it matched, candidates verified with the stored
                 signatures: the earliest earlier kept document each document matches, or -1 (match/<unit>.npy);
  3. rule        one task: a document matched in any band (or by its text hash) is removed by the earlier parts;
                 the rest are decided in corpus order by a Python loop over only the documents in a run of this
                 part, each checked against the kept members of its runs (rule/kept.npy, and rule/UUUUU.jsonl:
                 [line, dup_of, reason] per removed document of unit U);
  4. removal     tasks = executor.tasks_for(input shards): each shard rewritten;
  5. index       IndexWrite (index.py): one unit per index file group; then index/meta.json, written last here.
Every file is named after its shard, band or index piece, never a rank: 1 task or 3 write the same bytes.
DedupStats as deduplicate() returns them, but cluster_sizes stays empty (the rule forms no clusters), pairs are
counted by the match tasks (per band, against the earlier parts) and by the rule's loop (this part's runs), and
cluster_bytes_per_document is what the rule task held at its peak, per document.

Scale, for N documents in this part, K kept by the earlier parts and P = bands*rows:
  - memory: a match task holds one band's keys and document indices of this part (16 bytes a document; 24 for the
    text hashes), the earlier part's keys of that band while it searches them (8 bytes a kept document, 16 for the
    hashes) and the candidates of one chunk (PAIR_CHUNK pairs, two P x uint32 signatures each). The rule task
    holds 26 bytes a document (three int64 arrays, two masks; 16 more while a band's matches are merged in), 24
    bytes per run membership, the signatures of the documents in runs (4P bytes each), a list entry per kept run
    member, ~18 bytes per removed document and one unit's keeper labels at a time (its held_bytes stat);
  - what it reads of the earlier index: per band task, that band's keys whole (8 bytes a kept document) and the text
    hashes' (16) for the exact task; rows, signatures (4P bytes a row) and labels only where a candidate or a match
    points (memory maps of the store's own folder). A store without a local folder (S3) reads whole objects, so
    each earlier index is downloaded once into work_dir/earlier/ first, its signatures included (K x 4P bytes).
"""

from __future__ import annotations

import math
import mmap
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import orjson
from datatrove.pipeline.base import PipelineStep

from pipelines.dedup.clusters import ShardRemoval
from pipelines.dedup.index import (MAX_KEPT, EarlierIndex, IndexMatch, IndexPart, IndexWrite, index_pieces,
                                   match_units, open_earlier, write_meta)
from pipelines.dedup.config import DedupConfig
from pipelines.dedup.minhash import estimated_jaccard
from pipelines.dedup.stage import BUCKET_TASK_DOCS, DedupStats, dedup_stats, prepare_units, write_unit_index
from pipelines.dedup.steps import DedupSignatures, Shard, read_signatures, read_unit_index, unit_file
from pipelines.runner import LocalRunner, stat_totals
from storage.objects import write_atomic

__all__ = ["IndexPart", "deduplicate_sequential"]

NONE = np.iinfo(np.int64).max  # "no match" where the earliest match is a minimum


def deduplicate_sequential(
    *,
    sources: Sequence[tuple[str, Sequence[Shard | Path | str]]],
    earlier: Sequence[IndexPart],
    config: DedupConfig,
    work_dir: Path,
    out_dir: Path,
    executor=None,
) -> DedupStats:
    """Deduplicate this part's documents (`sources` in recipe order) against `earlier` (in corpus order) and itself.
    config.rule is not read here: it is the caller's choice between this function and stage.py's deduplicate()."""
    names, units, work_dir, out_dir = prepare_units(sources, work_dir, out_dir)
    parts = open_earlier(earlier, config, work_dir)  # a part with other settings is refused before any work
    executor = executor or LocalRunner()

    def tasks(natural: int, most: int) -> int:
        return max(1, min(executor.tasks_for(natural), most))

    def run(phase: str, step, tasks: int) -> Path:
        return executor.run([step], logging_dir=work_dir / "logs" / phase, tasks=tasks)

    run("signatures", DedupSignatures(units, config, work_dir), tasks(len(units), len(units)))
    info = write_unit_index(units, config, work_dir)
    if info["documents"] > MAX_KEPT:
        raise ValueError(f"dedup: a part holds at most {MAX_KEPT} documents (its index rows are uint32), this one "
                         f"{info['documents']}: split it")
    # As stage.py's buckets: below BUCKET_TASK_DOCS documents (here and searched) a pool costs more than it saves.
    searched = info["documents"] + sum(part.kept for part in parts)
    natural = min(max(1, len(units)), math.ceil(searched / BUCKET_TASK_DOCS))
    matches = match_units(config)
    # Named as stage.py's phases, whose _stats reads them: match and rule stand for its buckets and clusters.
    totals = {"buckets": run("match", IndexMatch(matches, config, work_dir, parts), tasks(natural, len(matches)))}
    totals["clusters"] = run("rule", SequentialRule(config, work_dir, parts), 1)
    totals["removal"] = run("removal", SequentialRemoval(units, work_dir, out_dir), tasks(len(units), len(units)))
    pieces = index_pieces(config)
    run("index", IndexWrite(pieces, config, work_dir, out_dir), tasks(natural, len(pieces)))
    write_meta(out_dir, config, int(np.load(work_dir / "rule" / "kept.npy").sum()))
    totals = {phase: stat_totals(path) for phase, path in totals.items()}
    totals["buckets"] += totals["clusters"]  # pairs are counted by the match tasks and by the rule's loop
    return dedup_stats(names, units, work_dir, totals, info["documents"])


class SequentialRule(PipelineStep):
    """One task: which documents of the part go, and the earliest kept document each matched (rule/)."""

    type = "🫂 - DEDUP"
    name = "🎯 rule"

    def __init__(self, config: DedupConfig, work_dir: Path, earlier: Sequence[EarlierIndex]):
        super().__init__()
        self.config, self.work_dir, self.earlier = config, Path(work_dir), list(earlier)

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        if world_size != 1:
            raise ValueError(f"dedup rule: one task walks the part in order, got {world_size} tasks")
        with self.track_time("stage"):
            held = self._rule()
        self.stat_update("held_bytes", value=held, unit="stage")
        return iter(())

    def _load(self, name: str) -> np.ndarray:
        path = self.work_dir / "match" / name
        if not path.is_file():
            raise FileNotFoundError(f"dedup rule: {path} is missing: the match phase has not completed")
        return np.load(path)

    def _rule(self) -> int:
        """Decides every document of the part and writes the plans; returns the bytes held at the peak (the
        arrays' nbytes and the containers' sys.getsizeof while the loop's state is alive: the same on every run)."""
        config, info = self.config, read_unit_index(self.work_dir)
        n = info["documents"]
        offsets = np.array([u["offset"] for u in info["units"]] + [n], dtype=np.int64)
        same_text = self._load("exact.npy")
        same_text[same_text < 0] = NONE  # the earliest earlier kept document with the same text hash
        match = same_text.copy() if config.exact else np.full(n, NONE, dtype=np.int64)
        bands = [f"band-{b:02d}" for b in range(config.bands)] if config.near else []
        for band in bands:
            earliest = self._load(f"{band}.npy")
            np.minimum(match, np.where(earliest < 0, NONE, earliest), out=match)
        by_earlier = match != NONE
        # This part's runs, one row per membership [document, run, 1 if exact], runs numbered apart across files.
        exact_runs = self._load("exact.runs.npy")
        exact_run = np.full(n, -1, dtype=np.int64)  # tells an exact duplicate from a near one
        exact_run[exact_runs[:, 1]] = exact_runs[:, 0]
        groups = ([(exact_runs, 1)] if config.exact else []) + [(self._load(f"{b}.runs.npy"), 0) for b in bands]
        members, base = [np.empty((0, 3), dtype=np.int64)], 0
        for runs, is_exact in groups:
            if len(runs):
                members.append(np.stack([runs[:, 1], runs[:, 0] + base, np.full(len(runs), is_exact)], axis=1))
                base += int(runs[:, 0].max()) + 1
        members = np.concatenate(members)
        members = members[~by_earlier[members[:, 0]]]  # removed by an earlier part: nobody's keeper here
        members = members[np.lexsort((members[:, 1], members[:, 0]))]
        colliding = np.unique(members[:, 0])
        verify = config.near and config.verify_threshold > 0
        sigs = (read_signatures(self.work_dir, offsets, [u["documents"] for u in info["units"]], config.permutations,
                                colliding) if verify else np.empty((0, config.permutations), dtype=np.uint32))
        dup_of, kept_in = self._within(members, colliding, sigs, verify)
        held = (same_text.nbytes + match.nbytes + exact_run.nbytes + 2 * by_earlier.nbytes + members.nbytes
                + colliding.nbytes + sigs.nbytes + sys.getsizeof(dup_of) + sys.getsizeof(kept_in)
                + sum(map(sys.getsizeof, kept_in.values())))
        del members, sigs, kept_in
        self.stat_update("colliding_documents", value=len(colliding))
        self.stat_update("removed_by_earlier_parts", value=int(by_earlier.sum()))
        self.stat_update("removed_within_part", value=len(dup_of))
        self._write_plans(info, match, same_text, dup_of, exact_run)
        return held

    def _write_plans(self, info: dict, match: np.ndarray, same_text: np.ndarray, dup_of: dict[int, int],
                     exact_run: np.ndarray) -> None:
        """rule/UUUUU.jsonl for every unit, [line, keeper's label, reason] per removed document (an empty file where
        nothing goes), one unit's labels in memory at a time; then rule/kept.npy. The reason is exact_duplicate when
        the keeper's text hash is the document's: the earliest earlier kept one with that hash, or a member of its
        exact run here."""
        by_earlier = np.flatnonzero(match != NONE)
        within = np.fromiter(dup_of, dtype=np.int64, count=len(dup_of))
        within_keeper = np.fromiter(dup_of.values(), dtype=np.int64, count=len(dup_of))
        docs = np.concatenate([by_earlier, within])
        keeper = np.concatenate([match[by_earlier], within_keeper])  # an earlier kept index, or a document here
        earlier = np.arange(len(docs)) < len(by_earlier)
        exact = np.concatenate([match[by_earlier] == same_text[by_earlier],
                                (exact_run[within] >= 0) & (exact_run[within] == exact_run[within_keeper])])
        order = np.argsort(docs)
        docs, keeper, earlier, exact = docs[order], keeper[order], earlier[order], exact[order]
        bounds = np.searchsorted(docs, [u["offset"] for u in info["units"]] + [info["documents"]])
        part_offsets = np.array([part.offset for part in self.earlier], dtype=np.int64)
        (self.work_dir / "rule").mkdir(parents=True, exist_ok=True)
        for unit, u in enumerate(info["units"]):
            mine = slice(bounds[unit], bounds[unit + 1])
            here = self._labels(info, np.unique(keeper[mine][~earlier[mine]]))
            labels = {("here", d): label for d, label in here.items()}
            theirs = np.unique(keeper[mine][earlier[mine]])
            part_of = np.searchsorted(part_offsets, theirs, side="right") - 1
            for p in np.unique(part_of).tolist():
                at = theirs[part_of == p]
                labels.update(zip((("earlier", a) for a in at.tolist()), self.earlier[p].labels(at - part_offsets[p])))
            lines = [orjson.dumps([d - u["offset"], labels["earlier" if e else "here", k],
                                   "exact_duplicate" if x else "near_duplicate"]) + b"\n"
                     for d, k, e, x in zip(docs[mine].tolist(), keeper[mine].tolist(), earlier[mine].tolist(),
                                           exact[mine].tolist())]
            write_atomic(unit_file(self.work_dir, "rule", unit, ".jsonl"), lines)
        kept = np.ones(info["documents"], dtype=bool)
        kept[docs] = False
        np.save(self.work_dir / "rule" / "kept.npy", kept)  # last: the index phase reads it (after this task's marker)

    def _within(self, members: np.ndarray, colliding: np.ndarray, sigs: np.ndarray,
                verify: bool) -> tuple[dict[int, int], dict[int, list[int]]]:
        """In corpus order over the documents in runs: a document goes when a kept member of one of its runs
        matches it (an exact run: at once; a band's: verified), the earliest such being its keeper; else it is
        kept, and joins its runs' kept members. Returns ({removed document: keeper}, {run: kept members})."""
        dup_of: dict[int, int] = {}
        kept_in: dict[int, list[int]] = {}
        doc_of, run_of, exact_of = (members[:, k].tolist() for k in range(3))
        row_of = {d: i for i, d in enumerate(colliding.tolist())}
        threshold, pairs, verified, exact_pairs = self.config.verify_threshold, 0, 0, 0
        i = 0
        while i < len(doc_of):
            d, j = doc_of[i], i
            exact: list[int] = []
            near: set[int] = set()
            while j < len(doc_of) and doc_of[j] == d:
                keepers = kept_in.get(run_of[j])
                if keepers:
                    (exact.extend if exact_of[j] else near.update)(keepers)
                j += 1
            keeper = min(exact) if exact else NONE
            exact_pairs += bool(exact)
            candidates = sorted(c for c in near if c < keeper)
            if candidates and verify:
                pairs += len(candidates)
                agree = estimated_jaccard(sigs[[row_of[c] for c in candidates]], sigs[row_of[d]][None, :]) >= threshold
                hits = np.flatnonzero(agree)
                verified += len(hits)
                keeper = candidates[hits[0]] if len(hits) else keeper
            elif candidates:
                pairs += len(candidates)
                verified += len(candidates)
                keeper = candidates[0]
            if keeper == NONE:
                for run in run_of[i:j]:
                    kept_in.setdefault(run, []).append(d)
            else:
                dup_of[d] = keeper
            i = j
        self.stat_update("candidate_pairs", value=pairs)
        self.stat_update("verified_pairs", value=verified)
        self.stat_update("exact_pairs", value=exact_pairs)
        return dup_of, kept_in

    def _labels(self, info: dict, docs: np.ndarray) -> dict[int, str]:
        """{document: "<source>/<id>"} for these documents of the part, only their lines of the keys files read."""
        labels: dict[int, str] = {}
        units = np.searchsorted([u["offset"] for u in info["units"]], docs, side="right") - 1
        for unit in np.unique(units).tolist():
            u = info["units"][unit]
            bounds = np.memmap(unit_file(self.work_dir, "signatures", unit, ".keys_index"), dtype=np.uint64, mode="r")
            with open(unit_file(self.work_dir, "signatures", unit, ".keys.jsonl"), "rb") as f:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as keys:
                    for d in docs[units == unit].tolist():
                        line = d - u["offset"]
                        labels[d] = f"{u['source']}/{orjson.loads(keys[int(bounds[line]) : int(bounds[line + 1])])[0]}"
        return labels


class SequentialRemoval(ShardRemoval):
    """The sequential rule's removal: only removed documents are in its plan ([line, dup_of, reason]); they get
    metadata.dedup_reason and metadata.dup_of, and every kept document stays the same bytes."""

    plan_phase = "rule"

    def apply(self, doc: dict, entry: list) -> str | None:
        label, reason = entry
        doc["metadata"]["dedup_reason"] = reason
        doc["metadata"]["dup_of"] = label
        return reason
