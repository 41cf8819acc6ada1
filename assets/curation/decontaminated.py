"""`curation/<source>/decontaminated`: the source's part of the deduplicated output without benchmark text.

Every document sharing an n-gram with a benchmark file the recipe lists is removed (or the span cut out of it,
pipelines/decontam.py). Output under curation/<source>/decontaminated/<version key>/: part-NNNNN.jsonl.gz and
removed.jsonl.gz (with metadata.contaminated_by). The benchmark n-gram index is built once per (files, n) and
cached under the scratch root, so the per-source assets share it.
"""

import dataclasses
import os
from pathlib import Path

from dagster import AssetKey, MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output
from assets.core.versioning import file_fingerprints, section_sha256
from assets.curation.checks import benchmark_check, benchmark_check_spec, documents_check, documents_check_spec
from assets.curation.deduplicated import deduplicated_key
from assets.plots import bar_chart
from assets.recipe import Recipe, SourceConfig
from pipelines.decontam import BenchmarkIndex, DecontamConfig, decontaminate
from pipelines.readers import expand_inputs
from storage.manifest import data_version_of

# Bump when the decontamination code changes what it writes for the same settings.
DECONTAMINATED_IMPLEMENTATION = "v1"


def decontaminated_key(source_name: str) -> AssetKey:
    return AssetKey(["curation", source_name, "decontaminated"])


def benchmark_files(recipe: Recipe) -> list[Path]:
    """The recipe's benchmark files (globs allowed), relative to its base_dir. ValueError names a missing one."""
    if not recipe.decontamination.benchmarks:
        return []
    try:
        return expand_inputs(list(recipe.decontamination.benchmarks), recipe.input_root)
    except ValueError as exc:
        raise ValueError(f"recipe {recipe.name!r}: decontamination.benchmarks: {exc}") from None


def decontaminated_asset(recipe: Recipe, source: SourceConfig, upstream_key: AssetKey | None = None):
    """`upstream_key` is the global deduplicated asset, whose `<source>/part-*` files this asset reads."""
    upstream_key = upstream_key or deduplicated_key()
    key = decontaminated_key(source.name)
    settings = recipe.decontamination

    def prepare(inputs: Inputs) -> Inputs:
        benchmarks = benchmark_files(recipe)
        # Keyed on this source's slice of the dedup output, not the whole: a change in another source that
        # leaves this one's documents as they were finds this output committed and reuses it, so its data
        # version, and everything downstream of it, stays as it was.
        own = [f for f in inputs.outputs["documents"].manifest["files"] if f["path"].startswith(f"{source.name}/")]
        # Built (or loaded from the cache) either way: the blocking check re-scans a reused output as well.
        index = _cached_index(inputs.resources.scratch, benchmarks, settings, inputs.log.info)
        return inputs.but(key_upstream={f"{upstream_key.to_user_string()}[{source.name}]": data_version_of(own)},
                          fingerprints=file_fingerprints(benchmarks),
                          manifest={"inputs": [str(path) for path in benchmarks]}, extra={"index": index})

    def build(inputs: Inputs, out_dir: Path) -> dict:
        index = inputs.extra["index"]
        parts = inputs.outputs["documents"].download(inputs.store, inputs.work / "in", pattern_prefix=f"{source.name}/part-")
        stats = decontaminate(inputs=parts, index=index, config=settings, out_dir=out_dir)
        return {"files": stats.files, "counts": {
            "in": stats.documents_in,
            "kept": stats.kept,
            "dropped": {"contaminated": stats.dropped} if stats.dropped else {},
            "cut": stats.cut,
            "chars_cut": stats.chars_cut,
            "hits": stats.hits,
            "benchmark_ngrams": len(index.hashes),
            "short_items": index.short_items,
        }}

    def checks(inputs: Inputs, output: Output) -> list:
        parts = output.files()
        return [documents_check(inputs.store, {source.name: parts}, {source.name: source.filter}),
                benchmark_check(inputs.store, parts, inputs.extra["index"])]

    def metadata(inputs: Inputs, output: Output) -> dict:
        counts = output.manifest["counts"]
        return {
            "documents": counts["kept"],
            "documents_in": counts["in"],
            "dropped": sum(counts["dropped"].values()),
            "cut": counts["cut"],
            "hits_per_benchmark": MetadataValue.json(counts["hits"]),
            "hits_plot": bar_chart(dict(sorted(counts["hits"].items(), key=lambda item: -item[1])),
                                   title=f"{source.name}: contaminated documents per benchmark", ylabel="documents"),
            "benchmark_ngrams": counts["benchmark_ngrams"],
        }

    return output_asset(OutputSpec(
        key=key, group="curation", stage="decontaminated", implementation=DECONTAMINATED_IMPLEMENTATION,
        section={"source": source.name, "decontamination": dataclasses.asdict(settings)},
        description=(
            f"Source `{source.name}` after dedup, without documents that share a {settings.ngram}-gram with any of "
            f"the recipe's {len(settings.benchmarks)} benchmark file(s) (action: {settings.action}). Driven by the "
            "recipe's `decontamination` section."
        ),
        reads={"documents": upstream_key}, prepare=prepare, build=build, checks=checks, metadata=metadata,
        # The benchmark check blocks: a failure stops the packed shards (and all else downstream) in the run.
        check_specs=[documents_check_spec(key), benchmark_check_spec(key)],
        failures=(ValueError,),  # a benchmark file the recipe names is missing
    ))


def _cached_index(scratch, files: list[Path], settings: DecontamConfig, log) -> BenchmarkIndex:
    """Building the index of all demo benchmarks takes ~10 s; every source's asset reuses one copy."""
    ngram, min_letter_words = settings.ngram, settings.min_letter_words
    digest = section_sha256(
        {"files": [str(p) for p in files], "fingerprints": file_fingerprints(files), "ngram": ngram, "min_letter_words": min_letter_words}
    )
    path = Path(scratch.root) / "decontam-index" / f"{digest[:16]}.npz"
    if path.is_file():
        return BenchmarkIndex.load(path)
    log(f"building the {ngram}-gram index of {len(files)} benchmark file(s)")
    index = BenchmarkIndex.build(files, ngram, min_letter_words)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")  # np.savez adds .npz unless the name has it
    index.save(tmp)
    os.replace(tmp, path)  # atomic: a concurrent reader sees the whole file or none
    return index
