"""What a training asset hands the trainer: local folders of the packed outputs, the tokenizer, the lineage.

    inputs = training_inputs(context, store, scratch, sources=["web", "code"])
    inputs.folders        # {"web": Path(...), ...}: packed outputs as trainer/data/mixture.py opens them
    inputs.lineage        # records from these outputs back to every raw source (assets/core/lineage.py); a crawl
                          # of dumps: from each dump's packed partition
    (a crawl of dumps is read as one source: a folder linking each dump's packed output, their manifests combined)
    inputs.upstream       # {asset: data_version} of the packed outputs and the tokenizer (for version keys)

With the local store the packed outputs are read in place; from S3 they are downloaded once into a
scratch cache keyed by their data version (outputs are immutable, so a cached copy never goes stale),
each file verified against its manifest's full sha256 as it downloads; at every start the trainer's reader checks
each shard's size and sampled sha256 from the packed index (storage/manifest.py), a cost flat in the data's size.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from dagster import AssetExecutionContext, AssetKey

from assets.core.lineage import lineage
from assets.core.upstream import Output, latest_output
from assets.recipe import Recipe
from assets.tokenization.packed import combined_manifest, packed_key, source_packed
from assets.tokenization.tokenizer import tokenizer_key
from resources.scratch import ScratchResource
from storage.manifest import MANIFEST
from storage.objects import ObjectStore


@dataclass(frozen=True)
class TrainingInputs:
    folders: dict[str, Path]
    outputs: dict[str, Output]  # source name -> its packed output (a crawl's dumps: their combined manifest)
    tokenizer: Output
    lineage: list[dict]
    parts: dict[str, list[Output]]  # source name -> its packed outputs: one, or a crawl's one per dump

    @property
    def upstream(self) -> dict[str, str]:
        versions = {o.key.to_user_string() + (f"[{o.partition}]" if o.partition is not None else ""): o.data_version
                    for outs in self.parts.values() for o in outs}
        return {**versions, self.tokenizer.key.to_user_string(): self.tokenizer.data_version}

    @property
    def tokenizer_sha256(self) -> str:
        return self.tokenizer.manifest["tokenizer"]["sha256"]


def local_folder(store: ObjectStore, output: Output, cache_root: Path) -> Path:
    """A local folder holding the output's files and manifest."""
    here = store.local_path(output.prefix)
    if here is not None:
        return here
    folder = cache_root / output.data_version
    if (folder / MANIFEST).exists():
        return folder
    partial = cache_root / f".{output.data_version}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    for entry in output.manifest["files"]:
        store.download(f"{output.prefix}/{entry['path']}", partial / entry["path"])  # verified by sha256
    (partial / MANIFEST).write_text(json.dumps(output.manifest))
    os.replace(partial, folder)
    return folder


def training_inputs(context: AssetExecutionContext, store: ObjectStore, scratch: ScratchResource,
                    sources: list[str], recipe: Recipe | None = None) -> TrainingInputs:
    """The packed outputs of `sources` (of the `recipe`'s, where a source is a crawl of dumps: every dump's, read as
    one source) and the tokenizer; OutputNotFound when one is missing (the asset factory fails the step with it)."""
    parts = {name: source_packed(context.instance, store, recipe.source(name)) if recipe is not None
             else [latest_output(context.instance, store, packed_key(name))] for name in sources}
    tokenizer = latest_output(context.instance, store, tokenizer_key())
    cache = Path(scratch.root) / "packed-cache"
    outputs = {name: outs[0] if len(outs) == 1 else
               Output(packed_key(name), prefix="", manifest=combined_manifest(outs)) for name, outs in parts.items()}
    folders = {name: dumps_folder(store, outs, outputs[name].manifest, cache) for name, outs in parts.items()}
    roots = [out for outs in parts.values() for out in outs]  # a crawl's lineage names each of its dumps
    return TrainingInputs(folders=folders, outputs=outputs, tokenizer=tokenizer, parts=parts,
                          lineage=lineage(context.instance, store, [*roots, tokenizer]))


def dumps_folder(store: ObjectStore, outputs: list[Output], manifest: dict, cache_root: Path) -> Path:
    """A local folder of packed shards: the output's own, or for a crawl's dumps a folder of links, one per dump's
    folder, with their combined `manifest` (assets/tokenization/packed.py's combined_manifest): no token is copied."""
    if len(outputs) == 1:
        return local_folder(store, outputs[0], cache_root)
    folder = cache_root / "dumps" / manifest["data_version"]
    if (folder / MANIFEST).exists():
        return folder
    partial = cache_root / "dumps" / f".{manifest['data_version']}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for out in outputs:
        os.symlink(local_folder(store, out, cache_root).resolve(), partial / out.partition)
    (partial / MANIFEST).write_text(json.dumps(manifest))
    os.replace(partial, folder)
    return folder


def packed_keys(sources: list[str]) -> list[AssetKey]:
    return [packed_key(name) for name in sources] + [tokenizer_key()]
