"""What a run reports: the JSONL metric records and TensorBoard (MFU against the device's peak), the device's
peak FLOP/s, and the Dagster Pipes channel back to the asset that launched the run.

It may import trainer.config; dagster-pipes, the trainer's only Dagster dependency, is imported lazily in
pipes.py alone.
"""
