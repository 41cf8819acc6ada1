"""Resources: the Dagster resources the assets use (object store, scratch space, executor, launcher, Slurm).

The store itself is the plain `storage` package, shared with the engines; this package is the Dagster side.
"""
