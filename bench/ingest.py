"""Benchmark: raw WARC ingest, ours against datatrove's own pipeline, on the same real file in the same run.

    .venv/bin/python bench/ingest.py [--workers 2] [--repeat 1] [--smoke]

Baseline: datatrove's WarcReader -> Trafilatura() -> JsonlWriter, run by LocalPipelineExecutor(tasks=1,
workers=1) as a user would (its extractor runs in its subprocess sandbox, 1 s timeout a page).
Ours: pipelines.ingest.ingest_source(format="warc") with `--workers` extraction processes.
Both read ../shared/data/crawl/web-pages.warc.gz (1,171 HTML pages) and write gzip JSONL.
Prints documents, docs/s and MB/s (compressed input bytes per second) for both, then the last line
`ratio: X.XX` = our docs/s / datatrove's docs/s (the best of `--repeat` runs each).
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


def warc_head(warc: Path, records: int, out: Path) -> Path:
    """The first `records` records of `warc`, as a file of their own in `out`."""
    from warcio.archiveiterator import ArchiveIterator

    with open(warc, "rb") as f:
        iterator = ArchiveIterator(f)
        end = None
        for i, _ in enumerate(iterator):
            if i == records:
                end = iterator.get_record_offset()
                break
        f.seek(0)
        # One gzip member per record (the WARC norm): the bytes before record `records` are a valid WARC.
        head = f.read(end if end is not None else -1)
    out.mkdir(parents=True, exist_ok=True)
    (out / warc.name).write_bytes(head)
    return out / warc.name


def run_datatrove(work: Path, warc: Path) -> tuple[int, float]:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.readers import WarcReader
    from datatrove.pipeline.writers import JsonlWriter

    out = work / "datatrove-out"
    executor = LocalPipelineExecutor(
        pipeline=[
            WarcReader(str(warc.parent), glob_pattern=warc.name),
            Trafilatura(),
            JsonlWriter(str(out)),
        ],
        tasks=1,
        workers=1,
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


def run_ours(work: Path, workers: int, warc: Path) -> tuple[int, float, dict]:
    sys.path.insert(0, str(REPO))
    from pipelines.ingest import ingest_source
    from pipelines.readers import ReaderConfig

    start = time.perf_counter()
    stats = ingest_source(
        name="web", inputs=[warc], format="warc", reader=ReaderConfig(workers=workers), out_dir=work / "ours-out"
    )
    seconds = time.perf_counter() - start
    return stats.documents, seconds, {"skipped": stats.skipped, "bad": stats.bad, "records": stats.records}


def report(label: str, documents: int, seconds: float, warc: Path) -> float:
    rate = documents / seconds
    megabytes = warc.stat().st_size / 1e6
    print(f"{label:<34} {documents:>6} documents {seconds:7.2f} s {rate:7.1f} docs/s {megabytes / seconds:6.2f} MB/s")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="our HTML extraction processes")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; the fastest counts")
    parser.add_argument("--smoke", action="store_true",
                        help=f"the file's first {SMOKE_PAGES} pages: the bench runs, no figure means anything")
    args = parser.parse_args()
    if not WARC.is_file():
        sys.exit(f"bench/ingest.py: {WARC} not found (the shared data is expected beside the repository)")

    with tempfile.TemporaryDirectory(prefix="bench-ingest-input-") as inputs:
        warc, pages = WARC, "1,171 HTML pages"
        if args.smoke:
            warc, pages = warc_head(WARC, SMOKE_PAGES, Path(inputs)), f"its first {SMOKE_PAGES} pages"
        best_dt = best_ours = None
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
                dt = run_datatrove(Path(tmp), warc)
                ours = run_ours(Path(tmp), args.workers, warc)
            best_dt = dt if best_dt is None or dt[1] < best_dt[1] else best_dt
            best_ours = ours if best_ours is None or ours[1] < best_ours[1] else best_ours

        print(f"\ninput: {WARC} ({warc.stat().st_size / 1e6:.1f} MB, {pages})")
        dt_rate = report("datatrove WarcReader+Trafilatura", *best_dt, warc)
        ours_rate = report(f"ours ingest_source workers={args.workers}", best_ours[0], best_ours[1], warc)
    print(f"ours: {best_ours[2]['records']} records, skipped {best_ours[2]['skipped']}, bad {best_ours[2]['bad']}")
    print(f"ratio: {ours_rate / dt_rate:.2f}")


if __name__ == "__main__":  # datatrove's executor and our pool start processes: no work at import
    main()
