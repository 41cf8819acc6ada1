"""Tokenization and packing: the tokenizer trained on a bounded, seeded sample, documents encoded and packed into
flat token streams per input shard, and the packed layout (token and offset files, index.json) the trainer
reads; config.py holds the recipe's `tokenizer` and `packing` sections.

It may import the shared pipelines.shards, and storage (sampled sha256).
"""
