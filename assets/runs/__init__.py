"""How `pretrain` runs assets: the scheduler that runs independent assets side by side, each a Dagster run of its own
(parallel), where those runs execute (runners), the runs whose process died, marked failed by the next command (dead),
the figures each run's done line shows (figures), and what the command shows while it runs: its lines and a live line
on the terminal (progress), read from the runs as they go (watch), everything else in a log file (output). It imports
nothing of the asset groups: it runs what the Definitions hold.
"""
