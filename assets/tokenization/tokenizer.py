"""`tokenization/tokenizer`: a byte-level BPE trained on a deterministic sample of every source's documents, or
the tokenizer.json the recipe names (`tokenizer.path`), with EOS and PAD. Output: tokenizer.json; the manifest
records its sha256, the special tokens and their ids.

A crawl of dumps (assets/dumps.py) is sampled in its first dump. The sample is drawn by the executor resource's tasks, each streaming its share of the sources' committed parts
from the store and keeping each part's bottom sample (pipelines/tokenization/pack.py SampleShards); the parts' samples are
merged into the sample one pass over each whole source would draw (bounded by `sample_bytes`), so neither the
task count nor the parts' split changes the tokenizer.

Trained once and kept: its code version is its recipe section alone (no code digest), and its version key names
the sample it was trained on (the sources' data versions, recorded as the manifest's "upstream"). Once a
tokenizer of this section is committed, a later materialization keys on that recorded sample, so a filter change
upstream finds the same tokenizer, commits the same data version, and nothing packed with it goes stale. A new
one is trained when the section changes, or when the run asks for it (`pretrain materialize --select
tokenization/tokenizer --refresh`, the run tag pretrain/refresh=true): then the sample is drawn from the
sources' current outputs.
"""

import dataclasses
import hashlib
from pathlib import Path
from typing import Callable

from dagster import AssetKey

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.lineage import SEARCH_LIMIT
from assets.core.upstream import Output, OutputNotFound, latest_output
from assets.dumps import dumps_partitions
from assets.core.versioning import file_fingerprints
from assets.recipe import Recipe
from pipelines.runner import stat_totals
from storage.manifest import read_manifest

TOKENIZER_FILE = "tokenizer.json"
REFRESH_TAG = "pretrain/refresh"  # a run tag: "true" trains a new tokenizer on the sources' current outputs
ROUND_TRIP_CHECKED = 1000  # sampled documents a trained tokenizer must encode and decode back exactly


def tokenizer_key() -> AssetKey:
    return AssetKey(["tokenization", "tokenizer"])


def tokenizer_path(recipe: Recipe) -> Path | None:
    """The tokenizer.json to adopt, resolved against the recipe's base_dir; None to train one."""
    if recipe.tokenizer.path is None:
        return None
    path = Path(recipe.tokenizer.path).expanduser()
    return path if path.is_absolute() else recipe.input_root / path


def tokenizer_section(recipe: Recipe) -> dict:
    settings = dataclasses.asdict(recipe.tokenizer)
    if recipe.tokenizer.path is not None:
        # Adopted: only the file and the special tokens matter (the file's fingerprint goes in the version key).
        return {"path": settings["path"], "eos": settings["eos"], "pad": settings["pad"]}
    return {"tokenizer": settings, "sources": [source.name for source in recipe.sources]}


def tokenizer_asset(recipe: Recipe, upstream_key: Callable[[str], AssetKey]):
    config = recipe.tokenizer
    adopt = tokenizer_path(recipe)
    how = (
        f"adopted from {config.path}"
        if adopt
        else f"a byte-level BPE of {config.vocab_size} tokens trained on {config.sample_bytes:,} bytes sampled from every source"
    )

    def prepare(inputs: Inputs) -> Inputs:
        if adopt:
            return inputs.but(fingerprints=file_fingerprints([adopt]), manifest={"inputs": [str(adopt)]})
        inputs = inputs.but(manifest={"inputs": []}, outputs={**inputs.outputs, **first_dumps(inputs)})
        if inputs.context.run.tags.get(REFRESH_TAG) == "true":
            inputs.log.info("refresh asked for: the sample is drawn from the sources' current outputs")
            return inputs
        kept = kept_sample(inputs, spec.code_version)
        if kept is None:
            return inputs
        inputs.log.info(f"a tokenizer of this recipe section was trained on {kept}: reusing it (the sources' "
                        "current outputs are not sampled again; --refresh trains a new one)")
        return inputs.but(key_upstream=kept)

    def first_dumps(inputs: Inputs) -> dict[str, Output]:
        """A crawl of dumps is sampled in its first dump: the tokenizer is trained once, and a sample that grew
        with every dump would name a new one each time."""
        found = {}
        for source in (s for s in recipe.sources if s.has_dumps):
            dumps = sorted(inputs.context.instance.get_dynamic_partitions(dumps_partitions(source).name))
            if not dumps:
                raise OutputNotFound(f"source {source.name!r} has no dump yet: the tokenizer samples its first one")
            found[source.name] = latest_output(inputs.context.instance, inputs.store, upstream_key(source.name),
                                               dumps[0])
        return found

    def build(inputs: Inputs, out_dir: Path) -> dict:
        from pipelines.tokenization.pack import SampleShards, merged_sample
        from pipelines.tokenization.tokenizer import adopt_tokenizer, round_trip_failures, special_ids, train_tokenizer
        if adopt:
            built = adopt_tokenizer(adopt, config)
            sampled = checked = 0
        else:
            if inputs.key_upstream is not None:  # a kept tokenizer's key names a sample that is no longer current
                raise ValueError(f"the tokenizer trained on {inputs.key_upstream} is recorded but its output is gone "
                                 "from the store: materialize it with --refresh to train one on the current sources")
            sources = {name: out.files() for name, out in inputs.outputs.items()}
            executor = inputs.resources.executor
            sample_dir = inputs.work / "sample"
            step = SampleShards(store=inputs.store, sources=sources, config=config, output_dir=str(sample_dir))
            stats_path = executor.run([step], logging_dir=inputs.work / "logs" / "sample",
                                      tasks=executor.tasks_for(sum(map(len, sources.values()))))
            texts = merged_sample(sample_dir, sources, config)
            inputs.log.info(f"sampled {stat_totals(stats_path, step=SampleShards.name)['sampled_documents']} "
                            f"document(s) from {sum(map(len, sources.values()))} part(s); merged: {len(texts)}")
            sampled = sum(len(t.encode("utf-8")) for t in texts)
            inputs.log.info(f"training a {config.vocab_size}-token BPE on {len(texts)} texts, {sampled:,} bytes")
            built = train_tokenizer(texts, config)
            # Spread over the sample, which lists the sources one after another.
            check = texts[:: max(1, len(texts) // ROUND_TRIP_CHECKED)][:ROUND_TRIP_CHECKED]
            failures = round_trip_failures(built, check)
            if failures:
                raise ValueError(f"{len(failures)} of {len(check)} sampled documents do not decode back exactly")
            checked = len(check)
        ids = special_ids(built, config)
        built.save(str(out_dir / TOKENIZER_FILE))
        return {
            "tokenizer": {
                "sha256": hashlib.sha256((out_dir / TOKENIZER_FILE).read_bytes()).hexdigest(),
                "vocab_size": built.get_vocab_size(with_added_tokens=True),
                "eos": config.eos,
                "eos_id": ids["eos"],
                "pad": config.pad,
                "pad_id": ids["pad"],
                "adopted": adopt is not None,
            },
            "counts": {"sample_bytes": sampled, "round_trip_documents": checked},
        }

    def metadata(inputs: Inputs, output: Output) -> dict:
        info, counts = output.manifest["tokenizer"], output.manifest["counts"]
        return {
            "tokenizer_sha256": info["sha256"],
            "vocab_size": info["vocab_size"],
            "eos_id": info["eos_id"],
            "pad_id": info["pad_id"],
            "sample_bytes": counts["sample_bytes"],
            "round_trip_documents": counts["round_trip_documents"],
        }

    spec = OutputSpec(
        key=tokenizer_key(), group="tokenization", stage="tokenizer", section=tokenizer_section(recipe),
        code=None,  # kept whatever the code: a new tokenizer would make every packed shard and stage stale
        description=f"The tokenizer: {how}; EOS {config.eos!r}, PAD {config.pad!r}. Driven by the recipe's `tokenizer` section.",
        # An adopted tokenizer does not depend on the documents; a trained one samples every source.
        reads={} if adopt else {s.name: upstream_key(s.name) for s in recipe.sources if not s.has_dumps},
        deps=[] if adopt else [upstream_key(s.name) for s in recipe.sources if s.has_dumps],
        prepare=prepare, build=build, metadata=metadata,
        failures=(ValueError,),  # a tokenizer that cannot be adopted or does not round-trip
        resources=frozenset({"executor"}), resumable=True,
    )
    return output_asset(spec)


def kept_sample(inputs: Inputs, code_version: str) -> dict[str, str] | None:
    """{asset: data version} of the sample the latest committed tokenizer of this code version was trained on, or
    None when there is none (among the asset's last SEARCH_LIMIT materializations)."""
    records = inputs.context.instance.fetch_materializations(tokenizer_key(), limit=SEARCH_LIMIT).records
    for record in records:  # newest first
        materialization = record.asset_materialization
        prefix = materialization.metadata.get("prefix") if materialization is not None else None
        manifest = read_manifest(inputs.store, prefix.value) if prefix is not None else None
        if manifest is not None and manifest.get("code_version") == code_version:
            return manifest["upstream"]
    return None

