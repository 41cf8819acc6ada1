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

from assets.core.factory import IN_ORDER, Inputs, OutputSpec, output_asset
from assets.core.upstream import Output, partition_outputs
from assets.curation.checks import documents_check, documents_check_spec
from assets.plots import bar_chart, count_table, histogram
from assets.dumps import dump_partitioned, dumps_partitions
from assets.recipe import Recipe, SourceConfig

# Settings that change how the work is done but never its output: tuning them leaves the asset fresh.
DEDUP_FIELDS_NOT_VERSIONED = ("batch_shingles", "bucket_docs")


def deduplicated_key() -> AssetKey:
    return AssetKey(["curation", "deduplicated"])


def dedup_settings(recipe: Recipe) -> dict:
    """The dedup settings that decide an output."""
    settings = dataclasses.asdict(recipe.dedup)
    for name in DEDUP_FIELDS_NOT_VERSIONED:
        settings.pop(name)
    if settings["rule"] == "transitive":  # the rule before there was a choice: its outputs stay fresh
        settings.pop("rule")
    return settings


def dedup_section(recipe: Recipe) -> dict:
    """What decides the output: the dedup settings and the sources in recipe order (the keep rule uses it); a crawl
    of dumps has its own asset (dump_deduplicated_asset), so adding one leaves this output as it was."""
    return {"dedup": dedup_settings(recipe), "sources": [s.name for s in recipe.sources if not s.has_dumps]}


def deduplicated_asset(recipe: Recipe, upstream_key: Callable[[str], AssetKey]):
    """`upstream_key(source name)` names the asset each source's documents come from."""
    key = deduplicated_key()
    reads = {source.name: upstream_key(source.name) for source in recipe.sources if not source.has_dumps}

    def build(inputs: Inputs, out_dir) -> dict:
        # Every task streams its own shards from the store (Shard pickles the store for Ray and Slurm workers).
        from pipelines.dedup.sequential import deduplicate_sequential
        from pipelines.dedup.stage import deduplicate
        from pipelines.dedup.steps import Shard
        sources = [(name, [Shard(name, key, inputs.store) for key in inputs.outputs[name].files()]) for name in reads]
        shards = sum(len(shards) for _, shards in sources)
        inputs.log.info(f"deduplicating {shards} shard(s) of {len(sources)} source(s) in {inputs.work}")
        # The sequential rule also writes the index of what it kept: a crawl's dumps are deduplicated against it.
        if recipe.dedup.rule == "sequential":
            stats = deduplicate_sequential(sources=sources, earlier=[], config=recipe.dedup, work_dir=inputs.work,
                                           out_dir=out_dir, executor=inputs.resources.executor)
        else:
            stats = deduplicate(sources=sources, config=recipe.dedup, work_dir=inputs.work, out_dir=out_dir,
                                executor=inputs.resources.executor)
        return dedup_fields(stats)

    def checks(inputs: Inputs, output: Output) -> list:
        # Every source's kept documents in one suite (ids unique across them), each against its own filter's
        # languages and PII settings.
        return [documents_check(inputs.store, {name: output.files(f"{name}/part-") for name in reads},
                                {source.name: source.filter for source in recipe.sources}, recipe.checks)]

    rule = ("per cluster the document with the smallest (source position in the recipe, id) is kept"
            if recipe.dedup.rule == "transitive" else
            "in recipe order, a document is removed when it matches an earlier kept one")
    return output_asset(OutputSpec(
        key=key, group="curation", stage="deduplicated",
        section=dedup_section(recipe),
        description=(
            "Exact and MinHash-LSH near-duplicates removed across all sources together "
            f"({recipe.dedup.ngram}-word shingles, {recipe.dedup.bands} bands x {recipe.dedup.rows} rows, candidates "
            f"verified at estimated Jaccard >= {recipe.dedup.verify_threshold}); {rule}. Driven by the recipe's "
            "`dedup` section."
        ),
        reads=reads, build=build, checks=checks, check_specs=[documents_check_spec(key)], metadata=dedup_metadata,
        resources=frozenset({"executor"}), resumable=True,
    ))


def dump_deduplicated_key(source_name: str) -> AssetKey:
    return AssetKey(["curation", source_name, "deduplicated"])


def dump_deduplicated_asset(recipe: Recipe, source: SourceConfig, upstream_key: Callable[[str], AssetKey]):
    """`curation/<source>/deduplicated[dump]` of a crawl of dumps: the dump's documents against themselves and against
    the index of everything kept before it, by the sequential rule. Before it: the global deduplicated output (the
    recipe's other sources), then the crawls' dumps in order: the crawls in recipe order, each crawl's dumps in name
    order. Nothing kept before changes, so a new dump leaves every earlier output, and what is downstream of it, as
    it was; an earlier part that changes (a filter edit) gives this part a new version key, as it should."""
    key = dump_deduplicated_key(source.name)
    crawls = [s for s in recipe.sources if s.has_dumps]
    before = crawls[:crawls.index(source)]  # crawls whose every dump comes before this crawl's
    has_base = any(not s.has_dumps for s in recipe.sources)
    reads = {"documents": upstream_key(source.name), **({"base": deduplicated_key()} if has_base else {})}

    def prepare(inputs: Inputs) -> Inputs:
        dump = inputs.context.partition_key
        instance = inputs.context.instance
        earlier: list[tuple[str, Output]] = []
        for crawl in [*before, source]:
            dumps = sorted(instance.get_dynamic_partitions(dumps_partitions(crawl).name))
            if crawl is source:
                dumps = [d for d in dumps if d < dump]
            found = partition_outputs(instance, inputs.store, dump_deduplicated_key(crawl.name), dumps)
            earlier += [(f"{crawl.name}/{d}", out) for d, out in found.items()]
        parts = ([("base", inputs.outputs["base"])] if has_base else []) + earlier
        return inputs.but(key_upstream={**inputs.upstream_versions(),
                                        **{f"{key.to_user_string()}[{name}]": out.data_version
                                           for name, out in earlier}},
                          manifest={"earlier": {name: out.data_version for name, out in parts}},
                          extra={"earlier": parts})

    def build(inputs: Inputs, out_dir) -> dict:
        from pipelines.dedup.sequential import IndexPart, deduplicate_sequential
        from pipelines.dedup.steps import Shard
        shards = [Shard(source.name, k, inputs.store) for k in inputs.outputs["documents"].files()]
        parts = inputs.extra["earlier"]
        inputs.log.info(f"deduplicating {len(shards)} shard(s) of {source.name}[{inputs.context.partition_key}] "
                        f"against the index of {len(parts)} earlier part(s)")
        stats = deduplicate_sequential(
            sources=[(source.name, shards)], config=recipe.dedup, work_dir=inputs.work, out_dir=out_dir,
            earlier=[IndexPart(store=inputs.store, prefix=out.prefix, name=name) for name, out in parts],
            executor=inputs.resources.executor)
        return dedup_fields(stats)

    def checks(inputs: Inputs, output: Output) -> list:
        return [documents_check(inputs.store, {source.name: output.files(f"{source.name}/part-")},
                                {source.name: source.filter}, recipe.checks)]

    return output_asset(OutputSpec(
        key=key, group="curation", stage="deduplicated", section={
            "dedup": dedup_settings(recipe), "source": source.name,
            "after": ["base"] * has_base + [c.name for c in before]},
        description=(
            f"One dump of `{source.name}` deduplicated against itself and against every document kept before it "
            "(the recipe's other sources, then earlier dumps), by the sequential rule: a document is removed when "
            "it matches an earlier kept one. Its index of kept documents is part of the output, for the next dump."
        ),
        reads=reads, deps=[dump_deduplicated_key(c.name) for c in before], prepare=prepare, build=build,
        checks=checks, check_specs=[documents_check_spec(key)], metadata=dedup_metadata,
        failures=(ValueError,),  # an earlier part built with other dedup settings
        resources=frozenset({"executor"}), resumable=True,
        same_partition=frozenset({"documents"}),
        # Dump by dump, in order: each needs the index of the ones before it (assets/runs/parallel.py).
        asset_args={**dump_partitioned(source), "metadata": {IN_ORDER: True}},
    ))


def dedup_fields(stats) -> dict:
    """The manifest's fields of a dedup output."""
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


def dedup_metadata(inputs: Inputs, output: Output) -> dict:
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


def _per_source_table(per_source: dict) -> str:
    lines = ["| source | in | kept | removed |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {c['in']} | {c['kept']} | {c['removed']} |" for name, c in per_source.items()]
    return "\n".join(lines)
