"""How `pretrain` runs assets: the scheduler that runs independent assets side by side, each a Dagster run of its own
(parallel), the runs whose process died, marked failed by the next command (dead), and the figures each run's done
line shows (figures). It imports nothing of the asset groups: it runs what the Definitions hold.
"""
