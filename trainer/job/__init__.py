"""A training job detached from whoever starts it: the local wrapper process or a Slurm batch job, job.json (the
job's identity, restarts and excluded nodes) and `pretrain jobs`.

Torch-free and standard library only: the launcher resource imports it in the Dagster process, and the wrapper
runs by path, wherever the package is installed. It imports nothing of the project.
"""
