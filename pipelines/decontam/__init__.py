"""Decontamination: the benchmark n-gram index (sorted hashes behind a prefilter bitmap) and the scan that drops
or cuts a document that shares n-grams with a benchmark, one task per input part.

It may import pipelines.dedup.minhash (the word hashing), the shared pipelines.shards and pipelines.runner.
"""
