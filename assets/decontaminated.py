"""The `decontaminated` assets, one per recipe source (group "curation").

Each reads its source's part of the deduplicated output and removes (or cuts out of) every document sharing an
n-gram with a benchmark file the recipe lists (pipelines/decontam.py). Output under
curation/<source>/decontaminated/<version key>/: part-NNNNN.jsonl.gz and removed.jsonl.gz (with
metadata.contaminated_by). The benchmark n-gram index is built once per (files, n) and cached under the
scratch root, so the per-source assets share it.
"""

import dataclasses
import os
import shutil
from pathlib import Path

from dagster import AssetExecutionContext, AssetKey, Failure, MaterializeResult, MetadataValue, asset

from assets.checks import benchmark_check, benchmark_check_spec, documents_check, documents_check_spec
from assets.deduplicated import deduplicated_key
from assets.plots import bar_chart
from assets.recipe import Recipe, SourceConfig
from assets.upstream import Output, OutputNotFound, committed_result, latest_output
from assets.versioning import code_version, file_fingerprints, manifest_header, section_sha256, version_key
from pipelines.decontam import BenchmarkIndex, DecontamConfig, decontaminate
from pipelines.ingest import expand_inputs
from resources.scratch import ScratchResource
from storage.manifest import commit_folder, data_version_of, read_manifest
from resources.store_resource import StoreResource

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
    section = {"source": source.name, "decontamination": dataclasses.asdict(recipe.decontamination)}
    version = code_version("decontaminated", DECONTAMINATED_IMPLEMENTATION, section)
    settings = recipe.decontamination

    @asset(
        key=key,
        deps=[upstream_key],
        group_name="curation",
        code_version=version,
        kinds={"python"},
        # The benchmark check blocks: a failure stops the packed shards (and all else downstream) in the run.
        check_specs=[documents_check_spec(key), benchmark_check_spec(key)],
        description=(
            f"Source `{source.name}` after dedup, without documents that share a {settings.ngram}-gram with any of "
            f"the recipe's {len(settings.benchmarks)} benchmark file(s) (action: {settings.action}). Driven by the "
            "recipe's `decontamination` section."
        ),
    )
    def decontaminated(context: AssetExecutionContext, store: StoreResource, scratch: ScratchResource) -> MaterializeResult:
        object_store = store.open()
        try:
            upstream = latest_output(context.instance, object_store, upstream_key)
        except OutputNotFound as exc:
            raise Failure(description=str(exc)) from exc
        try:
            benchmarks = benchmark_files(recipe)
        except ValueError as exc:
            raise Failure(description=str(exc)) from exc
        # Keyed on this source's slice of the dedup output, not the whole: a change in another source that
        # leaves this one's documents as they were finds this output committed and reuses it, so its data
        # version, and everything downstream of it, stays as it was.
        own = [f for f in upstream.manifest["files"] if f["path"].startswith(f"{source.name}/")]
        vkey = version_key(
            version, upstream={f"{upstream_key.to_user_string()}[{source.name}]": data_version_of(own)},
            inputs=file_fingerprints(benchmarks),
        )
        prefix = "/".join(key.path + [vkey])

        manifest = read_manifest(object_store, prefix)
        # Built (or loaded from the cache) either way: the blocking check re-scans a reused output as well.
        index = _cached_index(scratch, benchmarks, settings, context.log.info)
        if manifest is not None:
            context.log.info(f"{object_store.uri(prefix)} is already committed for this version; reusing it")
        else:
            work = scratch.new_dir("/".join(key.path))
            inputs = upstream.download(object_store, work / "in", pattern_prefix=f"{source.name}/part-")
            stats = decontaminate(inputs=inputs, index=index, config=settings, out_dir=work / "out")
            manifest = commit_folder(
                object_store,
                prefix,
                work / "out",
                {
                    **manifest_header(key.path, vkey, version, section, context.run.run_id),
                    "upstream": {upstream_key.to_user_string(): upstream.data_version},
                    "inputs": [str(path) for path in benchmarks],
                    "files": stats.files,
                    "counts": {
                        "in": stats.documents_in,
                        "kept": stats.kept,
                        "dropped": {"contaminated": stats.dropped} if stats.dropped else {},
                        "cut": stats.cut,
                        "chars_cut": stats.chars_cut,
                        "hits": stats.hits,
                        "benchmark_ngrams": len(index.hashes),
                        "short_items": index.short_items,
                    },
                },
            )
            shutil.rmtree(work, ignore_errors=True)

        parts = Output(key, prefix, manifest).files()
        checks = [documents_check(object_store, {source.name: parts}, {source.name: source.filter}),
                  benchmark_check(object_store, parts, index)]
        counts = manifest["counts"]
        return committed_result(
            object_store,
            prefix,
            manifest,
            check_results=checks,
            metadata={
                "documents": counts["kept"],
                "documents_in": counts["in"],
                "dropped": sum(counts["dropped"].values()),
                "cut": counts["cut"],
                "hits_per_benchmark": MetadataValue.json(counts["hits"]),
                "hits_plot": bar_chart(dict(sorted(counts["hits"].items(), key=lambda item: -item[1])),
                                       title=f"{source.name}: contaminated documents per benchmark", ylabel="documents"),
                "benchmark_ngrams": counts["benchmark_ngrams"],
                "version_key": vkey,
                "data_version": manifest["data_version"],
            },
        )

    return decontaminated


def _cached_index(scratch: ScratchResource, files: list[Path], settings: DecontamConfig, log) -> BenchmarkIndex:
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
