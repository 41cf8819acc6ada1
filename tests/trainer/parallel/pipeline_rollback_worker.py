"""Run under torchrun with 2 ranks (tests/trainer/parallel/test_pipeline.py): a 2-stage pipeline trainer whose samples 56..79
are noise, so the spike guard skips three steps and rolls back to the checkpoint before them (a fresh pipeline
engine loads it). Rank 0 writes the trainer's history and summary to the JSON file named by argv[1]; the run's
settings are the JSON file named by argv[2]."""

import json
import os
import sys

import torch.distributed as dist

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def main(out: str, settings: str) -> None:
    from tests.trainer.checkpoint.test_checkpointer import GarbageAt
    from trainer.config import load_run_config
    from trainer.train import Trainer, build_sources

    cfg = load_run_config(settings)
    train, val = build_sources(cfg)
    trainer = Trainer(cfg, train_source=GarbageAt(train, set(range(56, 80))), val_sources=val)
    summary = trainer.fit()
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"summary": summary, "history": trainer.history}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
