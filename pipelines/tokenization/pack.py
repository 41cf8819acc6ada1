"""Tokenization as datatrove pipelines: the tokenizer's sample and the packing, one task per share of input shards.

    steps = [PackShards(store=store, keys=keys, tokenizer_file=path, eos_id=0, config=PackingConfig(),
                        output_dir=out)]
    stats_path = executor.run(steps, logging_dir=work / "logs" / "pack", tasks=executor.tasks_for(len(keys)))
    executor.run([PackIndex(output_dir=out, shards=shard_names(keys), ...)], logging_dir=work / "logs" / "index", tasks=1)

Input shards are store keys of gzip JSON-lines parts (a committed output's `part-*.jsonl.gz`), read as streams
through the store (local folder or S3), never downloaded whole. Task `rank` of `world_size` takes the shards
rank, rank + world_size, ...; every output file is named after its input shard (`shard_name`), so the files are
the same whatever the task count, and a source's token stream is its shards in input order, each shard's
documents in line order (pipelines/tokenization/packed_format.py). The index is written by one small task after all the
packing tasks: it reads the shards' sizes and a few sampled blocks of each, not their contents.

SampleShards writes each input shard's bottom sample (pipelines/tokenization/tokenizer.py bottom_sample) for the tokenizer;
`merged_sample` merges them into the sample `sample_texts` would draw from the whole source in one pass.
Counts go to datatrove's stats (documents, tokens per split) and are read back from the merged stats.json.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path, PurePosixPath

import orjson
from datatrove.pipeline.base import PipelineStep

from pipelines.tokenization.packed_format import build_index, write_index
from pipelines.shards import GzipLines, store_documents
from pipelines.tokenization.config import PackingConfig, TokenizerConfig
from pipelines.tokenization.tokenizer import bottom_sample, pack_documents, sample_key, source_budget, token_dtype

SAMPLE_COMPRESSLEVEL = 1  # intermediate files in the work folder: speed over size


def shard_name(key: str) -> str:
    """'curation/web/decontaminated/<v>/part-00003.jsonl.gz' -> 'part-00003': what the outputs are named after."""
    name = PurePosixPath(key).name
    for suffix in (".gz", ".jsonl"):
        name = name.removesuffix(suffix)
    return name


def check_unique_names(keys: list[str]) -> list[str]:
    """The keys, refused (before any task starts) when two would give outputs of the same name."""
    names = [shard_name(key) for key in keys]
    if len(set(names)) != len(names):
        raise ValueError(f"two input shards have the same name; outputs are named after them: {sorted(keys)}")
    return list(keys)


class PackShards(PipelineStep):
    """Tokenizes and packs this task's input shards, each into its own train / val files."""

    name = "📦 pack shards"
    type = "🔢 - TOKENIZER"

    def __init__(self, *, store, keys: list[str], tokenizer_file: str, eos_id: int, config: PackingConfig,
                 output_dir: str):
        super().__init__()
        self.store, self.keys, self.tokenizer_file = store, check_unique_names(keys), str(tokenizer_file)
        self.eos_id, self.config, self.output_dir = eos_id, config, str(output_dir)

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        from tokenizers import Tokenizer  # loaded in the task (a Ray or Slurm worker), not pickled with the step

        tokenizer = Tokenizer.from_file(self.tokenizer_file)
        for key in self.keys[rank::world_size]:  # every world_size-th from rank: datatrove's own split of files
            with self.track_time(unit="shard"):
                stats = pack_documents(store_documents(self.store, key), tokenizer, eos_id=self.eos_id,
                                       out_dir=Path(self.output_dir), config=self.config, shard=shard_name(key))
            self.stat_update("shards", unit="shard")
            for split, counts in stats.splits.items():
                self.stat_update(f"{split}_documents", value=counts.documents, unit="shard")
                self.stat_update(f"{split}_tokens", value=counts.tokens, unit="shard")
        if data:
            yield from data


class PackIndex(PipelineStep):
    """The one-task step after packing: writes output_dir/index.json over every shard, in input order."""

    name = "🗂 pack index"
    type = "🔢 - TOKENIZER"

    def __init__(self, *, output_dir: str, shards: list[str], vocab_size: int, eos_id: int):
        super().__init__()
        self.output_dir, self.shards, self.vocab_size, self.eos_id = str(output_dir), list(shards), vocab_size, eos_id

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        if world_size != 1:
            raise ValueError(f"PackIndex runs as one task, got {world_size}")
        index = build_index(Path(self.output_dir), self.shards, dtype=token_dtype(self.vocab_size).name,
                            eos_id=self.eos_id, vocab_size=self.vocab_size)
        write_index(Path(self.output_dir), index)
        for split, info in index["splits"].items():
            self.stat_update(f"{split}_shards", value=len(info["shards"]), unit="index")
        if data:
            yield from data


class SampleShards(PipelineStep):
    """Each input shard's bottom sample for the tokenizer -> output_dir/<source>/<shard>.jsonl.gz ({key, text} lines
    in key order). `sources` lists each source's keys; a task takes its share of all of them."""

    name = "🎲 tokenizer sample"
    type = "🔢 - TOKENIZER"

    def __init__(self, *, store, sources: dict[str, list[str]], config: TokenizerConfig, output_dir: str):
        super().__init__()
        self.store, self.config, self.output_dir = store, config, str(output_dir)
        self.sources = {name: check_unique_names(keys) for name, keys in sources.items()}

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        budget = source_budget(self.config, len(self.sources))
        units = [(name, key) for name in sorted(self.sources) for key in self.sources[name]]
        for name, key in units[rank::world_size]:
            shard = shard_name(key)
            keyed = ((sample_key(self.config, name, doc.get("id"), f"{shard}#{line}"), doc["text"])
                     for line, doc in enumerate(store_documents(self.store, key)))
            picked = bottom_sample(keyed, budget)
            path = Path(self.output_dir) / name / f"{shard}.jsonl.gz"
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = path.with_name(f".{path.name}.tmp")
            with GzipLines(temp, compresslevel=SAMPLE_COMPRESSLEVEL) as out:
                for sample_hash, text in picked:
                    out.write({"key": sample_hash, "text": text})
            os.replace(temp, path)
            self.stat_update("shards", unit="shard")
            self.stat_update("sampled_documents", value=len(picked), unit="shard")
        if data:
            yield from data


def merged_sample(sample_dir: Path, sources: dict[str, list[str]], config: TokenizerConfig) -> list[str]:
    """The texts of every source's sample, merged from its shards' samples: source by source, in key order."""
    budget = source_budget(config, len(sources))
    texts: list[str] = []
    for name in sorted(sources):
        def keyed(name=name):
            for key in sources[name]:
                path = Path(sample_dir) / name / f"{shard_name(key)}.jsonl.gz"
                with gzip.open(path, "rb") as lines:
                    for line in lines:
                        record = orjson.loads(line)
                        yield record["key"], record["text"]
        texts += [text for _, text in bottom_sample(keyed(), budget)]
    return texts


def split_counts(stats: dict[str, int]) -> dict[str, dict[str, int]]:
    """{"train": {"tokens", "documents"}, "val": {...}} from PackShards' stats."""
    return {split: {"tokens": stats.get(f"{split}_tokens", 0), "documents": stats.get(f"{split}_documents", 0)}
            for split in ("train", "val")}

