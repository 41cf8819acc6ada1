"""Resources: the object store (plain, shared with the trainer) and the Dagster resources that wrap it.

Importing this package imports nothing else, so the trainer can use `resources.store` without Dagster.
"""
