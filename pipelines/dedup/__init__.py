"""Deduplication: MinHash signatures with exact and LSH candidates verified, in four phases on the executor
(signatures per input shard, buckets per band group, clusters over document indices, removal per input shard).

It may import the shared pipelines.inputs and pipelines.runner, and storage.
"""
