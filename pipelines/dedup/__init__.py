"""Deduplication: MinHash signatures with exact and LSH candidates verified (minhash.py), by one of two rules
(config.py: the recipe's `dedup` section).

transitive (stage.py's deduplicate): every source at once, in four phases on the executor (steps.py: signatures per
input shard, buckets per band group; clusters.py: clusters over document indices, removal per input shard).
sequential (sequential.py's deduplicate_sequential): one part of a growing corpus (a crawl's dump) against the index
of what the earlier parts kept (index.py: the index files, written with the part's output, and the earlier parts
opened from the store), so no kept document of an earlier part ever changes.

It may import the shared pipelines.inputs and pipelines.runner, and storage.
"""
