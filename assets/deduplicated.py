"""The `deduplicated` asset: one global stage over every source of the recipe (group "curation").

Exact dedup on the normalized text, then MinHash LSH with verified candidates (pipelines/dedup.py), across all
sources, so the same page in two sources is caught. The kept document of each cluster is the one with the
smallest (source position in the recipe, document id): moving a source up the recipe makes it win ties.

Output under curation/deduplicated/<version key>/: <source>/part-NNNNN.jsonl.gz (kept documents) and
<source>/removed.jsonl.gz (removed ones, with metadata.dedup_reason and dup_cluster) for every source.
"""

import dataclasses
import shutil
from typing import Callable

from dagster import AssetExecutionContext, AssetKey, Failure, MaterializeResult, MetadataValue, asset

from assets.checks import documents_check, documents_check_spec
from assets.plots import bar_chart, count_table, histogram
from assets.recipe import Recipe
from assets.upstream import Output, OutputNotFound, committed_result, latest_output
from assets.versioning import code_version, manifest_header, version_key
from pipelines.dedup import deduplicate
from resources.scratch import ScratchResource
from storage.manifest import commit_folder, read_manifest
from resources.store_resource import StoreResource

# Bump when the dedup code changes what it writes for the same settings.
DEDUPLICATED_IMPLEMENTATION = "v1"
# Settings that change how the work is done but never its output: tuning them leaves the asset fresh.
DEDUP_FIELDS_NOT_VERSIONED = ("batch_shingles",)


def deduplicated_key() -> AssetKey:
    return AssetKey(["curation", "deduplicated"])


def dedup_section(recipe: Recipe) -> dict:
    """What decides the output: the dedup settings and the sources in recipe order (the keep rule uses it)."""
    settings = dataclasses.asdict(recipe.dedup)
    for name in DEDUP_FIELDS_NOT_VERSIONED:
        settings.pop(name)
    return {"dedup": settings, "sources": [source.name for source in recipe.sources]}


def deduplicated_asset(recipe: Recipe, upstream_key: Callable[[str], AssetKey]):
    """`upstream_key(source name)` names the asset each source's documents come from."""
    key = deduplicated_key()
    section = dedup_section(recipe)
    version = code_version("deduplicated", DEDUPLICATED_IMPLEMENTATION, section)
    upstream_keys = {source.name: upstream_key(source.name) for source in recipe.sources}

    @asset(
        key=key,
        deps=list(upstream_keys.values()),
        group_name="curation",
        code_version=version,
        kinds={"python"},
        check_specs=[documents_check_spec(key)],
        description=(
            "Exact and MinHash-LSH near-duplicates removed across all sources together "
            f"({recipe.dedup.ngram}-word shingles, {recipe.dedup.bands} bands x {recipe.dedup.rows} rows, candidates "
            f"verified at estimated Jaccard >= {recipe.dedup.verify_threshold}); per cluster the document with the "
            "smallest (source position in the recipe, id) is kept. Driven by the recipe's `dedup` section."
        ),
    )
    def deduplicated(context: AssetExecutionContext, store: StoreResource, scratch: ScratchResource) -> MaterializeResult:
        object_store = store.open()
        try:
            upstream = {name: latest_output(context.instance, object_store, k) for name, k in upstream_keys.items()}
        except OutputNotFound as exc:
            raise Failure(description=str(exc)) from exc
        versions = {out.key.to_user_string(): out.data_version for out in upstream.values()}
        vkey = version_key(version, upstream=versions)
        prefix = "/".join(key.path + [vkey])

        manifest = read_manifest(object_store, prefix)
        if manifest is not None:
            context.log.info(f"{object_store.uri(prefix)} is already committed for this version; reusing it")
        else:
            work = scratch.new_dir("/".join(key.path))
            sources = [(name, out.download(object_store, work / "in" / name)) for name, out in upstream.items()]
            context.log.info(f"deduplicating {len(sources)} source(s) in {work}")
            stats = deduplicate(sources=sources, config=recipe.dedup, work_dir=work / "stages", out_dir=work / "out")
            manifest = commit_folder(
                object_store,
                prefix,
                work / "out",
                {
                    **manifest_header(key.path, vkey, version, section, context.run.run_id),
                    "upstream": versions,
                    "files": stats.files,
                    "counts": {
                        "in": sum(stats.documents_in.values()),
                        "kept": sum(stats.kept.values()),
                        "dropped": stats.removed,
                        "per_source": {
                            name: {"in": stats.documents_in[name], "kept": stats.kept[name], "removed": stats.removed_per_source[name]}
                            for name in stats.documents_in
                        },
                        "cluster_sizes": {str(size): n for size, n in stats.cluster_sizes.items()},
                        "candidate_pairs": stats.candidate_pairs,
                        "verified_pairs": stats.verified_pairs,
                    },
                },
            )
            shutil.rmtree(work, ignore_errors=True)

        # Every source's kept documents in one suite (ids unique across them), each against its own filter's
        # languages and PII settings; read back from the store, so a reused output is checked too.
        output = Output(key, prefix, manifest)
        check = documents_check(object_store, {name: output.files(f"{name}/part-") for name in upstream_keys},
                                {source.name: source.filter for source in recipe.sources})
        counts = manifest["counts"]
        return committed_result(
            object_store,
            prefix,
            manifest,
            check_results=[check],
            metadata={
                "documents": counts["kept"],
                "documents_in": counts["in"],
                "removed": sum(counts["dropped"].values()),
                "removed_by_reason": MetadataValue.json(counts["dropped"]),
                "cluster_size_histogram": MetadataValue.json(counts["cluster_sizes"]),
                "removed_table": count_table(counts["dropped"], key="reason", value="documents"),
                "cluster_sizes_plot": histogram({int(k): n for k, n in counts["cluster_sizes"].items()},
                                                title="duplicate clusters by size", xlabel="documents in the cluster",
                                                ylabel="clusters"),
                "kept_per_source_plot": bar_chart({name: c["kept"] for name, c in counts["per_source"].items()},
                                                  title="documents kept per source", ylabel="documents"),
                "per_source": MetadataValue.md(_per_source_table(counts["per_source"])),
                "per_source_counts": MetadataValue.json(counts["per_source"]),
                "candidate_pairs": counts["candidate_pairs"],
                "verified_pairs": counts["verified_pairs"],
                "version_key": vkey,
                "data_version": manifest["data_version"],
            },
        )

    return deduplicated


def _per_source_table(per_source: dict) -> str:
    lines = ["| source | in | kept | removed |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {c['in']} | {c['kept']} | {c['removed']} |" for name, c in per_source.items()]
    return "\n".join(lines)
