"""Tokenization assets (group "tokenization"): the tokenizer, and one packed output per source.

tokenization/tokenizer: a byte-level BPE trained on a deterministic sample of every source's documents, or
    the tokenizer.json the recipe names (`tokenizer.path`), with EOS and PAD. Output: tokenizer.json; the
    manifest records its sha256, the special tokens and their ids.
tokenization/<source>/packed: the source's documents encoded with that tokenizer, EOS after each, as flat
    train / val token streams with document offsets (pipelines/tokenize.py); the manifest's "packing"
    section is what trainer/data.py opens, and its "counts" give tokens and documents per split.

`tokenization_assets(recipe, upstream_key)` takes the function naming each source's upstream asset, so the
stage reads whichever curation output is last in the chain.
"""

import dataclasses
import hashlib
import shutil
from pathlib import Path
from typing import Callable, Iterator

from dagster import AssetExecutionContext, AssetKey, Failure, MaterializeResult, asset
from tokenizers import Tokenizer

from assets.plots import bar_chart
from assets.recipe import Recipe
from assets.upstream import OutputNotFound, committed_result, latest_output
from assets.versioning import code_version, file_fingerprints, manifest_header, version_key
from pipelines.ingest import iter_documents
from pipelines.tokenize import (
    adopt_tokenizer,
    pack_documents,
    round_trip_failures,
    sample_texts,
    special_ids,
    train_tokenizer,
)
from resources.scratch import ScratchResource
from storage.manifest import commit_folder, read_manifest
from resources.store_resource import StoreResource

# Bump when the code changes what it writes for the same settings.
TOKENIZER_IMPLEMENTATION = "v1"
PACKED_IMPLEMENTATION = "v1"
# Settings that change how the work is done but never its output (packing is batch-size independent).
PACKING_FIELDS_NOT_VERSIONED = ("batch_documents", "batch_bytes")
TOKENIZER_FILE = "tokenizer.json"
ROUND_TRIP_CHECKED = 1000  # sampled documents a trained tokenizer must encode and decode back exactly


def tokenizer_key() -> AssetKey:
    return AssetKey(["tokenization", "tokenizer"])


def packed_key(source_name: str) -> AssetKey:
    return AssetKey(["tokenization", source_name, "packed"])


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


def packed_section(recipe: Recipe, source_name: str) -> dict:
    settings = dataclasses.asdict(recipe.packing)
    for name in PACKING_FIELDS_NOT_VERSIONED:
        settings.pop(name)
    return {"source": source_name, "packing": settings}


def tokenization_assets(recipe: Recipe, upstream_key: Callable[[str], AssetKey]) -> list:
    """The tokenizer asset and one packed asset per source; `upstream_key(source)` names its documents' asset."""
    return [tokenizer_asset(recipe, upstream_key)] + [
        packed_asset(recipe, source.name, upstream_key) for source in recipe.sources
    ]


def tokenizer_asset(recipe: Recipe, upstream_key: Callable[[str], AssetKey]):
    key = tokenizer_key()
    config = recipe.tokenizer
    section = tokenizer_section(recipe)
    version = code_version("tokenizer", TOKENIZER_IMPLEMENTATION, section)
    adopt = tokenizer_path(recipe)
    # An adopted tokenizer does not depend on the documents; a trained one samples every source.
    upstream_keys = {} if adopt else {source.name: upstream_key(source.name) for source in recipe.sources}
    how = (
        f"adopted from {config.path}"
        if adopt
        else f"a byte-level BPE of {config.vocab_size} tokens trained on {config.sample_bytes:,} bytes sampled from every source"
    )

    @asset(
        key=key,
        deps=list(upstream_keys.values()),
        group_name="tokenization",
        code_version=version,
        kinds={"python"},
        description=f"The tokenizer: {how}; EOS {config.eos!r}, PAD {config.pad!r}. Driven by the recipe's `tokenizer` section.",
    )
    def tokenizer(context: AssetExecutionContext, store: StoreResource, scratch: ScratchResource) -> MaterializeResult:
        object_store = store.open()
        upstream = _upstream_outputs(context, object_store, upstream_keys)
        versions = {out.key.to_user_string(): out.data_version for out in upstream.values()}
        vkey = version_key(version, upstream=versions, inputs=file_fingerprints([adopt]) if adopt else None)
        prefix = "/".join(key.path + [vkey])

        manifest = read_manifest(object_store, prefix)
        if manifest is not None:
            context.log.info(f"{object_store.uri(prefix)} is already committed for this version; reusing it")
        else:
            work = scratch.new_dir("/".join(key.path))
            try:
                if adopt:
                    built = adopt_tokenizer(adopt, config)
                    sampled = checked = 0
                else:
                    parts = {name: out.download(object_store, work / "in" / name) for name, out in upstream.items()}
                    texts = sample_texts({name: _documents(paths) for name, paths in parts.items()}, config)
                    sampled = sum(len(t.encode("utf-8")) for t in texts)
                    context.log.info(f"training a {config.vocab_size}-token BPE on {len(texts)} texts, {sampled:,} bytes")
                    built = train_tokenizer(texts, config)
                    # Spread over the sample, which lists the sources one after another.
                    check = texts[:: max(1, len(texts) // ROUND_TRIP_CHECKED)][:ROUND_TRIP_CHECKED]
                    failures = round_trip_failures(built, check)
                    if failures:
                        raise ValueError(f"{len(failures)} of {len(check)} sampled documents do not decode back exactly")
                    checked = len(check)
                ids = special_ids(built, config)
            except ValueError as exc:
                raise Failure(description=str(exc)) from exc
            out = work / "out"
            out.mkdir()
            built.save(str(out / TOKENIZER_FILE))
            sha = hashlib.sha256((out / TOKENIZER_FILE).read_bytes()).hexdigest()
            manifest = commit_folder(
                object_store,
                prefix,
                out,
                {
                    **manifest_header(key.path, vkey, version, section, context.run.run_id),
                    "upstream": versions,
                    "inputs": [str(adopt)] if adopt else [],
                    "tokenizer": {
                        "sha256": sha,
                        "vocab_size": built.get_vocab_size(with_added_tokens=True),
                        "eos": config.eos,
                        "eos_id": ids["eos"],
                        "pad": config.pad,
                        "pad_id": ids["pad"],
                        "adopted": adopt is not None,
                    },
                    "counts": {"sample_bytes": sampled, "round_trip_documents": checked},
                },
            )
            shutil.rmtree(work, ignore_errors=True)

        info = manifest["tokenizer"]
        return committed_result(
            object_store,
            prefix,
            manifest,
            metadata={
                "tokenizer_sha256": info["sha256"],
                "vocab_size": info["vocab_size"],
                "eos_id": info["eos_id"],
                "pad_id": info["pad_id"],
                "sample_bytes": manifest["counts"]["sample_bytes"],
                "round_trip_documents": manifest["counts"]["round_trip_documents"],
                "version_key": vkey,
                "data_version": manifest["data_version"],
            },
        )

    return tokenizer


def packed_asset(recipe: Recipe, source_name: str, upstream_key: Callable[[str], AssetKey]):
    key = packed_key(source_name)
    section = packed_section(recipe, source_name)
    version = code_version("packed", PACKED_IMPLEMENTATION, section)
    documents_key = upstream_key(source_name)
    upstream_keys = {"tokenizer": tokenizer_key(), "documents": documents_key}

    @asset(
        key=key,
        deps=list(upstream_keys.values()),
        group_name="tokenization",
        code_version=version,
        kinds={"python"},
        description=(
            f"Source `{source_name}` tokenized: flat train/val token streams (EOS after every document) and "
            f"document offsets, {recipe.packing.val_fraction:.1%} of documents held out by a hash of their id. "
            f"Reads {documents_key.to_user_string()}; driven by the recipe's `packing` section."
        ),
    )
    def packed(context: AssetExecutionContext, store: StoreResource, scratch: ScratchResource) -> MaterializeResult:
        object_store = store.open()
        upstream = _upstream_outputs(context, object_store, upstream_keys)
        versions = {out.key.to_user_string(): out.data_version for out in upstream.values()}
        vkey = version_key(version, upstream=versions)
        prefix = "/".join(key.path + [vkey])
        tokenizer_info = upstream["tokenizer"].manifest["tokenizer"]

        manifest = read_manifest(object_store, prefix)
        if manifest is not None:
            context.log.info(f"{object_store.uri(prefix)} is already committed for this version; reusing it")
        else:
            work = scratch.new_dir("/".join(key.path))
            [tokenizer_file] = upstream["tokenizer"].download(object_store, work / "tokenizer", TOKENIZER_FILE)
            built = Tokenizer.from_file(str(tokenizer_file))
            parts = upstream["documents"].download(object_store, work / "in")
            context.log.info(f"packing {len(parts)} part(s) of {source_name} in {work}")
            try:
                stats = pack_documents(
                    _documents(parts), built, eos_id=tokenizer_info["eos_id"], out_dir=work / "out", config=recipe.packing
                )
            except ValueError as exc:
                raise Failure(description=f"source {source_name!r}: {exc}") from exc
            manifest = commit_folder(
                object_store,
                prefix,
                work / "out",
                {
                    **manifest_header(key.path, vkey, version, section, context.run.run_id),
                    "upstream": versions,
                    "tokenizer": {"sha256": tokenizer_info["sha256"], "vocab_size": tokenizer_info["vocab_size"]},
                    "packing": stats.manifest_section(),
                    "counts": stats.counts(),
                },
            )
            shutil.rmtree(work, ignore_errors=True)

        counts = manifest["counts"]
        return committed_result(
            object_store,
            prefix,
            manifest,
            metadata={
                "tokens_train": counts["train"]["tokens"],
                "tokens_val": counts["val"]["tokens"],
                "documents_train": counts["train"]["documents"],
                "documents_val": counts["val"]["documents"],
                "dtype": manifest["packing"]["dtype"],
                "tokens_per_source_plot": _tokens_per_source(context.instance, recipe, source_name, counts),
                "tokenizer_sha256": manifest["tokenizer"]["sha256"],
                "version_key": vkey,
                "data_version": manifest["data_version"],
            },
        )

    return packed


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


def _upstream_outputs(context, object_store, keys: dict[str, AssetKey]) -> dict:
    try:
        return {name: latest_output(context.instance, object_store, k) for name, k in keys.items()}
    except OutputNotFound as exc:
        raise Failure(description=str(exc)) from exc


def _documents(paths: list[Path]) -> Iterator[dict]:
    for path in paths:
        yield from iter_documents(path)

