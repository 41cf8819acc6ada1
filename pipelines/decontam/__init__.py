"""Decontamination: the benchmark items as page texts with their ids (items.py), the benchmark n-gram index
(sorted hashes behind a prefilter bitmap, each naming its benchmark and item) and the scan that drops or cuts a
document that shares n-grams with a benchmark and reports every hit, one task per input part; config.py holds the
recipe's `decontamination` section.

It may import pipelines.dedup.minhash (the word hashing), the shared pipelines.shards and pipelines.runner.
"""
