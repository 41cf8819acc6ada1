"""`tokenization/<source>/packed`: the source's documents encoded with the tokenizer, EOS after each, as train / val
token streams with document offsets, one shard per input part (pipelines/tokenization/pack.py, layout in
pipelines/tokenization/packed_format.py), packed by the executor resource's tasks, then indexed by one small task. The
manifest's "packing" section is that index (what trainer/data/mixture.py opens), and its "counts" give tokens and
documents per split, from the packing tasks' stats.
"""

import dataclasses
import json
from pathlib import Path
from typing import Callable

from dagster import AssetKey

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output, OutputNotFound, latest_output, partition_outputs
from assets.plots import bar_chart
from assets.dumps import dump_partitioned, dumps_partitions
from assets.recipe import Recipe, SourceConfig
from assets.tokenization.tokenizer import TOKENIZER_FILE, tokenizer_key
from pipelines.runner import stat_totals
from pipelines.tokenization.config import PackingConfig
from storage.manifest import data_version_of

# Settings that change how the work is done but never its output (packing is batch-size independent).
PACKING_FIELDS_NOT_VERSIONED = ("batch_documents", "batch_bytes")


def packed_key(source_name: str) -> AssetKey:
    return AssetKey(["tokenization", source_name, "packed"])


def packed_section(recipe: Recipe, source_name: str) -> dict:
    settings = dataclasses.asdict(recipe.packing)
    for name in PACKING_FIELDS_NOT_VERSIONED:
        settings.pop(name)
    return {"source": source_name, "packing": settings}


def pack_parts(inputs: Inputs, keys: list[str], tokenizer: Output, out_dir: Path, *, name: str,
               config: PackingConfig) -> dict:
    """Pack the document parts at store `keys` (read by the executor's tasks, part by part) with the tokenizer
    into out_dir, index them, and return the manifest's fields ("tokenizer", "packing", "counts"). The packed
    asset's build; the filter ablations pack their arms' documents the same way (assets/curation/ablation.py)."""
    from tokenizers import Tokenizer

    from pipelines.tokenization.pack import PackIndex, PackShards, shard_name, split_counts
    from pipelines.tokenization.packed_format import INDEX_FILE
    info = tokenizer.manifest["tokenizer"]
    [tokenizer_file] = tokenizer.download(inputs.store, inputs.work / "tokenizer", TOKENIZER_FILE)
    vocab_size = Tokenizer.from_file(str(tokenizer_file)).get_vocab_size(with_added_tokens=True)
    executor = inputs.resources.executor
    tasks = executor.tasks_for(len(keys))
    inputs.log.info(f"packing {len(keys)} part(s) of {name} in {tasks} task(s)")
    pack = PackShards(store=inputs.store, keys=keys, tokenizer_file=str(tokenizer_file), eos_id=info["eos_id"],
                      config=config, output_dir=str(out_dir))
    logs = inputs.work / "logs" / name
    try:
        stats_path = executor.run([pack], logging_dir=logs / "pack", tasks=tasks)
    except ValueError as exc:
        raise ValueError(f"source {name!r}: {exc}") from exc
    index_step = PackIndex(output_dir=str(out_dir), shards=[shard_name(k) for k in keys], vocab_size=vocab_size,
                           eos_id=info["eos_id"])
    executor.run([index_step], logging_dir=logs / "index", tasks=1)
    index = json.loads((out_dir / INDEX_FILE).read_text())
    counts = split_counts(stat_totals(stats_path, step=PackShards.name))
    for split, split_info in index["splits"].items():  # every document the tasks counted is in the index
        assert counts[split] == {"tokens": split_info["tokens"], "documents": split_info["documents"]}, (split, counts)
    return {"tokenizer": {"sha256": info["sha256"], "vocab_size": info["vocab_size"]},
            "packing": index, "counts": counts}


def packed_asset(recipe: Recipe, source_name: str, upstream_key: Callable[[str], AssetKey]):
    documents_key = upstream_key(source_name)
    source = recipe.source(source_name)

    def build(inputs: Inputs, out_dir: Path) -> dict:
        return pack_parts(inputs, inputs.outputs["documents"].files(), inputs.outputs["tokenizer"], out_dir,
                          name=source_name, config=recipe.packing)

    def metadata(inputs: Inputs, output: Output) -> dict:
        counts = output.manifest["counts"]
        return {
            "tokens_train": counts["train"]["tokens"],
            "tokens_val": counts["val"]["tokens"],
            "documents_train": counts["train"]["documents"],
            "documents_val": counts["val"]["documents"],
            "dtype": output.manifest["packing"]["dtype"],
            "tokens_per_source_plot": _tokens_per_source(inputs.context.instance, recipe, source_name, counts),
            "tokenizer_sha256": output.manifest["tokenizer"]["sha256"],
        }

    return output_asset(OutputSpec(
        key=packed_key(source_name), group="tokenization", stage="packed",
        section=packed_section(recipe, source_name),
        description=(
            f"Source `{source_name}` tokenized: train/val token streams (EOS after every document) and document "
            f"offsets, one shard per input part with an index, {recipe.packing.val_fraction:.1%} of documents "
            "held out by a hash of their id. "
            f"Reads {documents_key.to_user_string()}; driven by the recipe's `packing` section."
        ),
        reads={"tokenizer": tokenizer_key(), "documents": documents_key}, build=build, metadata=metadata,
        failures=(ValueError,),  # documents the packer refuses (named by source)
        resources=frozenset({"executor"}), resumable=True,
        # A crawl of dumps is packed dump by dump: a new dump packs its own documents only.
        same_partition=frozenset({"documents"}), asset_args=dump_partitioned(source),
    ))


def _tokens_per_source(instance, recipe: Recipe, source_name: str, counts: dict):
    """Train tokens of this source beside every other source's latest packed output (the picture is whole once
    the last source is packed; a source not packed yet shows 0)."""
    tokens = {}
    for source in recipe.sources:
        if source.name == source_name:
            tokens[source.name] = counts["train"]["tokens"]
            continue
        event = instance.get_latest_materialization_event(packed_key(source.name))
        entry = event.asset_materialization.metadata.get("tokens_train") if event else None
        tokens[source.name] = entry.value if entry is not None else 0
    return bar_chart(tokens, title="train tokens per source (latest packed outputs)", ylabel="tokens")


def source_packed(instance, store, source: SourceConfig) -> list[Output]:
    """A source's packed outputs: its latest one, or a crawl's every current dump's, in dump order. OutputNotFound
    names what was never materialized."""
    if not source.has_dumps:
        return [latest_output(instance, store, packed_key(source.name))]
    dumps = sorted(instance.get_dynamic_partitions(dumps_partitions(source).name))
    if not dumps:
        raise OutputNotFound(f"source {source.name!r} has no dump yet: {', '.join(source.inputs)} names no folder")
    return list(partition_outputs(instance, store, packed_key(source.name), dumps).values())


def combined_manifest(outputs: list[Output]) -> dict:
    """One packed manifest for a crawl's dumps, read as one source: each dump's shards, in dump order, under the
    dump's folder name (the folder that training/inputs.py links to it). What the trainer's reader opens."""
    if len(outputs) == 1:
        return outputs[0].manifest
    first = outputs[0].manifest["packing"]
    same = ("dtype", "eos_id", "vocab_size", "format")
    for out in outputs[1:]:
        differs = [f for f in same if out.manifest["packing"].get(f) != first.get(f)]
        if differs:
            raise ValueError(f"{out.key.to_user_string()}[{out.partition}] was packed with another {differs[0]} than "
                             f"[{outputs[0].partition}]: materialize the crawl's packed partitions again")
    splits = {}
    for split in first["splits"]:
        shards = [{**shard, "tokens_file": f"{out.partition}/{shard['tokens_file']}",
                   "offsets_file": f"{out.partition}/{shard['offsets_file']}"}
                  for out in outputs for shard in out.manifest["packing"]["splits"][split]["shards"]]
        splits[split] = {"tokens": sum(s["tokens"] for s in shards), "documents": sum(s["documents"] for s in shards),
                         "shards": shards}
    files = [{**f, "path": f"{out.partition}/{f['path']}"} for out in outputs for f in out.manifest["files"]]
    return {"packing": {**first, "splits": splits}, "files": files, "data_version": data_version_of(files),
            "dumps": {out.partition: out.data_version for out in outputs}}
