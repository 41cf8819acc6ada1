"""`curation/deduplicated`: one global stage over every source of the recipe.

Exact dedup on the normalized text, then MinHash LSH with verified candidates (pipelines/dedup.py), across all
sources, so the same page in two sources is caught. The kept document of each cluster is the one with the
smallest (source position in the recipe, document id): moving a source up the recipe makes it win ties.

Output under curation/deduplicated/<version key>/: <source>/part-NNNNN.jsonl.gz (kept documents) and
<source>/removed.jsonl.gz (removed ones, with metadata.dedup_reason and dup_cluster) for every source.
"""

import dataclasses
from typing import Callable

from dagster import AssetKey, MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output
from assets.curation.checks import documents_check, documents_check_spec
from assets.plots import bar_chart, count_table, histogram
from assets.recipe import Recipe
from pipelines.dedup import deduplicate

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
    reads = {source.name: upstream_key(source.name) for source in recipe.sources}

    def build(inputs: Inputs, out_dir) -> dict:
        sources = [(name, out.download(inputs.store, inputs.work / "in" / name)) for name, out in inputs.outputs.items()]
        inputs.log.info(f"deduplicating {len(sources)} source(s) in {inputs.work}")
        stats = deduplicate(sources=sources, config=recipe.dedup, work_dir=inputs.work / "stages", out_dir=out_dir)
        return {"files": stats.files, "counts": {
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
        }}

    def checks(inputs: Inputs, output: Output) -> list:
        # Every source's kept documents in one suite (ids unique across them), each against its own filter's
        # languages and PII settings.
        return [documents_check(inputs.store, {name: output.files(f"{name}/part-") for name in reads},
                                {source.name: source.filter for source in recipe.sources})]

    def metadata(inputs: Inputs, output: Output) -> dict:
        counts = output.manifest["counts"]
        return {
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
        }

    return output_asset(OutputSpec(
        key=key, group="curation", stage="deduplicated", implementation=DEDUPLICATED_IMPLEMENTATION,
        section=dedup_section(recipe),
        description=(
            "Exact and MinHash-LSH near-duplicates removed across all sources together "
            f"({recipe.dedup.ngram}-word shingles, {recipe.dedup.bands} bands x {recipe.dedup.rows} rows, candidates "
            f"verified at estimated Jaccard >= {recipe.dedup.verify_threshold}); per cluster the document with the "
            "smallest (source position in the recipe, id) is kept. Driven by the recipe's `dedup` section."
        ),
        reads=reads, build=build, checks=checks, check_specs=[documents_check_spec(key)], metadata=metadata,
    ))


def _per_source_table(per_source: dict) -> str:
    lines = ["| source | in | kept | removed |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {c['in']} | {c['kept']} | {c['removed']} |" for name, c in per_source.items()]
    return "\n".join(lines)
