"""Benchmark: raw WARC ingest, ours against datatrove's own pipeline, like for like, in the same run.

    .venv/bin/python bench/ingest.py [--pages N] [--repeat 1] [--smoke]

The input: ../shared/data/crawl/web-pages.warc.gz (1,171 HTML pages; `--pages N`: its first N) split into two
WARC files of half the pages each (in a temporary folder), so that two tasks have a file each.
Baseline: datatrove's WarcReader -> Trafilatura() -> JsonlWriter, run by LocalPipelineExecutor as a user would
(its extractor runs in its subprocess sandbox, 1 s timeout a page).
Ours: pipelines.ingest.step.ingest_source (our damage-tolerant reader, decoding and extraction in the task, shards
named after their input file), also run by LocalPipelineExecutor.
Both sides get the same processes: 2 tasks on 2 workers, then 1 task on 1 worker. Prints documents, docs/s and
MB/s (compressed input bytes per second) of each run, the two ratios (our docs/s / datatrove's docs/s, best of
`--repeat` runs each; and the same in MB/s, since datatrove keeps fewer of the pages), then the last line
`ratio: X.XX` = the smaller docs/s ratio.
`--smoke` runs the same paths on the file's first 40 pages: it checks that the bench works, its figures mean nothing.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CRAWL = REPO.parent / "shared" / "data" / "crawl"
WARC = CRAWL / "web-pages.warc.gz"
SMOKE_PAGES = 40
SETUPS = ((2, 2), (1, 1))  # (tasks, workers) on both sides


def split_warc(warc: Path, pages: int | None, out: Path) -> list[Path]:
    """The first `pages` records of `warc` (all: None) as two WARC files of half the records each, cut at gzip
    member boundaries (one record per member, the WARC norm)."""
    from warcio.archiveiterator import ArchiveIterator

    with open(warc, "rb") as f:
        iterator = ArchiveIterator(f)
        offsets = []
        for i, _ in enumerate(iterator):
            offsets.append(iterator.get_record_offset())
            if pages is not None and i == pages:
                break
        f.seek(0)
        data = f.read()
    end = offsets[pages] if pages is not None and len(offsets) > pages else len(data)
    count = pages if pages is not None and len(offsets) > pages else len(offsets)
    middle = offsets[count // 2]
    out.mkdir(parents=True, exist_ok=True)
    halves = [out / "web-pages-0.warc.gz", out / "web-pages-1.warc.gz"]
    halves[0].write_bytes(data[:middle])
    halves[1].write_bytes(data[middle:end])
    return halves


def run_datatrove(work: Path, inputs: list[Path], tasks: int, workers: int) -> tuple[int, float]:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.readers import WarcReader
    from datatrove.pipeline.writers import JsonlWriter

    out = work / "datatrove-out"
    executor = LocalPipelineExecutor(
        pipeline=[
            WarcReader(str(inputs[0].parent), glob_pattern="*.warc.gz"),
            Trafilatura(),
            JsonlWriter(str(out)),
        ],
        tasks=tasks,
        workers=workers,
        logging_dir=str(work / "datatrove-logs"),
    )
    start = time.perf_counter()
    executor.run()
    seconds = time.perf_counter() - start
    documents = 0
    for part in sorted(out.glob("*.jsonl.gz")):
        with gzip.open(part, "rb") as f:
            documents += sum(1 for line in f if line.strip())
    return documents, seconds


def close_helpers() -> None:
    from pipelines.runner import WorkerPool

    WorkerPool.close_all()


def run_ours(work: Path, inputs: list[Path], tasks: int, workers: int) -> tuple[int, float, dict]:
    sys.path.insert(0, str(REPO))
    from pipelines.ingest.step import ingest_source
    from pipelines.ingest.config import ReaderConfig

    start = time.perf_counter()
    stats = ingest_source(name="web", inputs=inputs, format="warc", reader=ReaderConfig(), out_dir=work / "ours-out",
                          tasks=tasks, workers=workers, logging_dir=work / "ours-logs")
    seconds = time.perf_counter() - start
    return stats.documents, seconds, {"skipped": stats.skipped, "bad": stats.bad, "records": stats.records}


def report(label: str, documents: int, seconds: float, megabytes: float) -> float:
    rate = documents / seconds
    print(f"{label:<48} {documents:>6} documents {seconds:7.2f} s {rate:7.1f} docs/s {megabytes / seconds:6.2f} MB/s")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=None, help="the file's first N pages only (default: all)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; the fastest counts")
    parser.add_argument("--smoke", action="store_true",
                        help=f"the file's first {SMOKE_PAGES} pages: the bench runs, no figure means anything")
    args = parser.parse_args()
    if not WARC.is_file():
        sys.exit(f"bench/ingest.py: {WARC} not found (the shared data is expected beside the repository)")
    pages = SMOKE_PAGES if args.smoke else args.pages

    ratios = []
    with tempfile.TemporaryDirectory(prefix="bench-ingest-input-") as folder:
        inputs = split_warc(WARC, pages, Path(folder))
        megabytes = sum(p.stat().st_size for p in inputs) / 1e6
        what = f"its first {pages} pages" if pages else "all 1,171 pages"
        print(f"\ninput: {WARC} ({what}) split into 2 files, {megabytes:.1f} MB")
        for tasks, workers in SETUPS:
            best_dt = best_ours = None
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
                    dt = run_datatrove(Path(tmp), inputs, tasks, workers)
                    ours = run_ours(Path(tmp), inputs, tasks, workers)
                    close_helpers()  # datatrove's next run forks: no helper threads may be alive then
                best_dt = dt if best_dt is None or dt[1] < best_dt[1] else best_dt
                best_ours = ours if best_ours is None or ours[1] < best_ours[1] else best_ours
            setup = f"tasks={tasks} workers={workers}"
            dt_rate = report(f"datatrove WarcReader+Trafilatura {setup}", *best_dt, megabytes)
            ours_rate = report(f"ours IngestStep {setup}", best_ours[0], best_ours[1], megabytes)
            print(f"ours {setup}: {best_ours[2]['records']} records, skipped {best_ours[2]['skipped']}, "
                  f"bad {best_ours[2]['bad']}")
            ratios.append(ours_rate / dt_rate)
            # Docs/s counts what each keeps (datatrove's reader drops ~18% of these pages); MB/s is input read.
            print(f"ratio {setup}: {ratios[-1]:.2f} in docs/s, {best_dt[1] / best_ours[1]:.2f} in MB/s")
    print(f"ratio: {min(ratios):.2f}")


if __name__ == "__main__":  # datatrove's executor starts processes (forkserver): no work at import
    main()
