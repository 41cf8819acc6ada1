"""`curation/deduplicated`: one global stage over every source of the recipe.

Exact dedup on the normalized text, then MinHash LSH with verified candidates (pipelines/dedup/minhash.py), across all
sources, so the same page in two sources is caught. The kept document of each cluster is the one with the
smallest (source position in the recipe, document id): moving a source up the recipe makes it win ties.

Runs as four datatrove pipelines on the executor resource (pipelines/dedup/stage.py): signatures and removal with
executor.tasks_for(input shards) tasks, each streaming its own upstream shards straight from the store (no
download of the whole input); buckets per band group; clusters in one task over document ids only (its bytes
per document are the manifest's counts.cluster_bytes_per_document). Each phase logs under work/logs/<phase>, and
the build is resumable: materialized again after a kill, it reruns only the tasks that had not completed.

Output under curation/deduplicated/<version key>/, per input shard of each source (named after it, so any task
count writes the same files): <source>/part-<shard>.jsonl.gz (kept documents) and <source>/removed-<shard>.jsonl.gz
(removed ones, with metadata.dedup_reason and dup_cluster); a file that would be empty is not written.
"""

import dataclasses
from typing import Callable

from dagster import AssetKey, MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output
from assets.curation.checks import documents_check, documents_check_spec
from assets.plots import bar_chart, count_table, histogram
from assets.recipe import Recipe
from pipelines.dedup.stage import deduplicate
from pipelines.dedup.steps import Shard

# Settings that change how the work is done but never its output: tuning them leaves the asset fresh.
DEDUP_FIELDS_NOT_VERSIONED = ("batch_shingles", "bucket_docs")


def deduplicated_key() -> AssetKey:
    return AssetKey(["curation", "deduplicated"])


def dedup_section(recipe: Recipe) -> dict:
    """What decides the output: the dedup settings and the sources in recipe order (the keep rule uses it)."""
    settings = dataclasses.asdict(recipe.dedup)
    for name in DEDUP_FIELDS_NOT_VERSIONED:
        settings.pop(name)
    if settings["rule"] == "transitive":  # the rule before there was a choice: its outputs stay fresh
        settings.pop("rule")
    return {"dedup": settings, "sources": [source.name for source in recipe.sources]}


def deduplicated_asset(recipe: Recipe, upstream_key: Callable[[str], AssetKey]):
    """`upstream_key(source name)` names the asset each source's documents come from."""
    key = deduplicated_key()
    reads = {source.name: upstream_key(source.name) for source in recipe.sources}

    def build(inputs: Inputs, out_dir) -> dict:
        # Every task streams its own shards from the store (Shard pickles the store for Ray and Slurm workers).
        sources = [(name, [Shard(name, key, inputs.store) for key in inputs.outputs[name].files()]) for name in reads]
        shards = sum(len(shards) for _, shards in sources)
        inputs.log.info(f"deduplicating {shards} shard(s) of {len(sources)} source(s) in {inputs.work}")
        stats = deduplicate(sources=sources, config=recipe.dedup, work_dir=inputs.work, out_dir=out_dir,
                            executor=inputs.resources.executor)
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
            "exact_pairs": stats.exact_pairs,
            "cluster_bytes_per_document": stats.cluster_bytes_per_document,
        }}

    def checks(inputs: Inputs, output: Output) -> list:
        # Every source's kept documents in one suite (ids unique across them), each against its own filter's
        # languages and PII settings.
        return [documents_check(inputs.store, {name: output.files(f"{name}/part-") for name in reads},
                                {source.name: source.filter for source in recipe.sources}, recipe.checks)]

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
            "cluster_bytes_per_document": counts["cluster_bytes_per_document"],
        }

    return output_asset(OutputSpec(
        key=key, group="curation", stage="deduplicated",
        section=dedup_section(recipe),
        description=(
            "Exact and MinHash-LSH near-duplicates removed across all sources together "
            f"({recipe.dedup.ngram}-word shingles, {recipe.dedup.bands} bands x {recipe.dedup.rows} rows, candidates "
            f"verified at estimated Jaccard >= {recipe.dedup.verify_threshold}); per cluster the document with the "
            "smallest (source position in the recipe, id) is kept. Driven by the recipe's `dedup` section."
        ),
        reads=reads, build=build, checks=checks, check_specs=[documents_check_spec(key)], metadata=metadata,
        resources=frozenset({"executor"}), resumable=True,
    ))


def _per_source_table(per_source: dict) -> str:
    lines = ["| source | in | kept | removed |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {c['in']} | {c['kept']} | {c['removed']} |" for name, c in per_source.items()]
    return "\n".join(lines)
