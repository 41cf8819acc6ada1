"""Filter rules: our steps against datatrove's same steps run bare, documents per second per core, on the demo's
documents, for the demo's `web` and `c4` rule sets.

    .venv/bin/python bench/filters.py [--rounds 3] [--smoke]

The documents are each source's raw documents (the real ingest of its demo inputs: the 1,168 pages of the web crawl
extracted, the 70 C4 and Dolma documents). A rule set is the source's recipe filter cut to the steps datatrove has
(URL blocklist, language ID, Gopher repetition, Gopher quality, C4, FineWeb): the quality model, offensive language,
perplexity and PII are ours alone and have no datatrove step to compare with. Our side is pipelines/filters/pipeline.py's
filter_steps; datatrove's side runs the same URL and language steps (datatrove's, set up offline) and, for each rule we
reimplement, datatrove's own step with the same settings (pipeline.py's datatrove_counterpart). Each document goes through
the steps in order until one drops it, on datatrove's side until our steps dropped it (the same documents reach each
rule on both sides; C4's kept text is each side's own).

Each side runs in a fresh process of its own, one after the other, one process each (its CPU time is the per-core
figure, so a shared machine's load moves it little): the steps are built and warmed up on WARM_UP_DOCUMENTS paragraphs
of wikitext-2 (the models and spaCy load; our word cache, pipelines/filters/words.py, sees the common words, as a task
has after its first documents), then every document is judged once; a word the warm-up did not have is tokenized on
the clock. Measured on 2 cores: without the warm-up, ours on the 70 C4 documents was 1.9x datatrove (every word new),
on the 1,168 web pages it made little difference. Best of `--rounds` pairs. Prints each rule set's documents per CPU second on both sides and their ratio, then
`ratio: X.XX` = the smaller of the two rule sets' ratios (target >= 2.0). `--smoke` uses the first 20 pages of each
WARC input and one round: it checks that the bench runs, its figures mean nothing.
"""

import argparse
import dataclasses
import multiprocessing
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Not bench/ itself on the path: a bench script named like a stdlib module (bench/tokenize.py) would shadow it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))
RULE_SETS = ("web", "c4")
SMOKE_PAGES = 20  # --smoke: records kept of each WARC input
WARM_UP_TEXT = "wiki/wikitext-2-valid.txt"  # under the demo's base_dir: English prose, none of it in the corpus
WARM_UP_DOCUMENTS = 200  # paragraphs of 40+ words (--smoke: 5)


def rule_set(source_name: str):
    """The demo source's filter settings cut to the steps datatrove has."""
    from assets.recipe import load_recipe

    config = load_recipe(REPO / "recipes" / "demo.yaml").source(source_name).filter
    return dataclasses.replace(config, sample=None, code=None, quality_model=None, toxicity=None, perplexity=None,
                               pii=None)


def documents(source_name: str, out: Path, smoke: bool) -> list[dict]:
    """The source's raw documents, from the real ingest of its demo inputs."""
    from assets.recipe import load_recipe
    from pipelines.ingest.step import ingest_source
    from pipelines.inputs import expand_inputs
    from pipelines.shards import iter_documents

    recipe = load_recipe(REPO / "recipes" / "demo.yaml")
    source = recipe.source(source_name)
    inputs = expand_inputs(list(source.inputs), recipe.input_root)
    if smoke and source.format in ("warc", "wet"):
        from bench.curation import cut_warc

        inputs = [cut_warc(Path(path), out / "smoke" / Path(path).name, SMOKE_PAGES) for path in inputs]
    ingest_source(name=source.name, inputs=inputs, format=source.format, reader=source.reader,
                  out_dir=out / source.name, tasks=len(inputs), workers=1)
    return [doc for part in sorted((out / source.name).glob("part-*.jsonl.gz")) for doc in iter_documents(part)]


def passes(source_name: str, docs: list[dict]) -> list[int]:
    """How many of our steps each document passes (len(steps): kept): which documents reach each rule."""
    from datatrove.data import Document

    from pipelines.filters.pipeline import filter_steps

    steps = filter_steps(rule_set(source_name), lists_root=REPO / "recipes")
    reached = []
    for raw in docs:
        doc, n = Document(text=raw["text"], id=raw["id"], metadata=dict(raw.get("metadata") or {})), 0
        for step in steps:
            verdict = step.filter(doc)
            if not (verdict is True or (isinstance(verdict, tuple) and verdict[0])):
                break
            n += 1
        reached.append(n)
    return reached


def warm_up_texts(count: int) -> list[str]:
    """Paragraphs of wikitext-2's validation split, one document each (no document of the corpus is among them)."""
    from assets.recipe import load_recipe

    lines = (load_recipe(REPO / "recipes" / "demo.yaml").input_root / WARM_UP_TEXT).read_text(encoding="utf-8")
    return [line.strip() for line in lines.splitlines() if len(line.split()) >= 40][:count]


def judge(side: str, source_name: str, docs: list[dict], reached: list[int], warm_up: list[str]) -> tuple[int, float]:
    """In a fresh process: (documents, CPU seconds) of one side judging every document once."""
    from datatrove.data import Document

    from pipelines.filters.pipeline import datatrove_counterpart, filter_steps

    ours = filter_steps(rule_set(source_name), lists_root=REPO / "recipes")
    steps = ours if side == "ours" else [datatrove_counterpart(step) or step for step in ours]
    for i, text in enumerate(warm_up):  # models and tokenizers load here, and our word cache sees common words
        doc = Document(text=text, id=f"warm-up-{i}", metadata={"url": "https://example.org/warm-up"})
        for step in steps:
            verdict = step.filter(doc)
            if not (verdict is True or (isinstance(verdict, tuple) and verdict[0])):
                break
    inputs = [Document(text=raw["text"], id=raw["id"], metadata=dict(raw.get("metadata") or {})) for raw in docs]
    started = time.process_time()
    for doc, n in zip(inputs, reached):
        for step in steps[:n + 1]:  # up to the step that drops it in our chain (the same on both sides)
            step.filter(doc)
    return len(inputs), time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="pairs of fresh processes; the best of each side counts")
    parser.add_argument("--smoke", action="store_true",
                        help=f"the first {SMOKE_PAGES} pages of each WARC input, one round: the bench runs, no figure")
    args = parser.parse_args()
    rounds = 1 if args.smoke else args.rounds
    ratios = []
    warm_up = warm_up_texts(5 if args.smoke else WARM_UP_DOCUMENTS)
    with tempfile.TemporaryDirectory(prefix="bench-filters-") as work:
        for name in RULE_SETS:
            docs = documents(name, Path(work), args.smoke)
            reached = passes(name, docs)
            best = {"ours": float("inf"), "datatrove": float("inf")}
            for _ in range(rounds):
                for side in best:  # a fresh process each: ours starts with no cached words
                    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                        count, cpu = pool.submit(judge, side, name, docs, reached, warm_up).result()
                    best[side] = min(best[side], cpu)
            rates = {side: len(docs) / cpu for side, cpu in best.items()}
            ratios.append(rates["ours"] / rates["datatrove"])
            steps = ", ".join(f.name for f in dataclasses.fields(rule_set(name)) if getattr(rule_set(name), f.name))
            print(f"{name} rules ({steps}): {len(docs)} documents, best of {rounds}: ours {best['ours']:.2f} CPU s = "
                  f"{rates['ours']:.1f} documents/s per core; datatrove {best['datatrove']:.2f} CPU s = "
                  f"{rates['datatrove']:.1f} documents/s per core; ours / datatrove {ratios[-1]:.2f}", flush=True)
    print(f"ratio: {min(ratios):.2f}")


if __name__ == "__main__":  # the spawned processes import this module again
    main()
