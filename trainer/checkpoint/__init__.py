"""Checkpoints: the checkpointer the loop calls (save, resume, rollback), committed step folders on local disk
and in the object store, the background uploader, the in-memory snapshot that makes a save asynchronous,
per-rank uploads for nodes without a shared filesystem, DeepSpeed's universal format for a resume across world
sizes, and whole fp32 weights read back for export, evaluation and init_from.

It may import trainer.config, trainer.exits, trainer.parallel, trainer.planner (Young's interval) and storage;
never the loop.
"""
