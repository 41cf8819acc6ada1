"""Where the tokens come from: packed shards read as one seeded stream per source and mixed by weight, a text
file cut into windows for demos and tests, and the RegMix mixture search the mixing assets run (its settings in
config.py).

It may import storage (sampled sha256 of shards) and nothing of the trainer, so that a data loader can be
tested and benchmarked without a model.
"""
