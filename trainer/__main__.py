"""Train from a run config:

    python -m trainer --config run.json
    torchrun --nproc_per_node 2 -m trainer --config run.json
    deepspeed --num_gpus 2 --module trainer --config run.json

Exit statuses and <output_dir>/failure.json: trainer/exits.py (one torch-free module, read by the launcher).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description="Train a model from run.json")
    parser.add_argument("--config", required=True, help="run.json (trainer.config.RunConfig as JSON)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None,
                        help="set by the deepspeed launcher; LOCAL_RANK in the environment is what is used")
    args = parser.parse_args(argv)

    from trainer.config import load_run_config
    from trainer.exits import CLEAN, TrainerExit, failure_record, write_failure

    def failed(kind: str, e: Exception, output_dir: str | None, **extra) -> int:
        print(f"error: {e}", file=sys.stderr)
        record = failure_record(kind, str(e), **extra)
        if output_dir:
            write_failure(output_dir, record)
        return record["exit_status"]

    try:
        cfg = load_run_config(args.config)
    except ValueError as e:
        return failed("config", e, _output_dir(args.config))

    import torch.distributed as dist

    from trainer.train import train

    try:
        train(cfg)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # no rank tears its process group down while another still uses it
        return CLEAN
    except TrainerExit as e:  # a refused resume, the spike guard, a corrupt rank, a straggler to drain
        status = failed(e.kind, e, cfg.output_dir, **e.extra)
        if e.agreed and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # every rank raised it after the same step: leave together, none killed half-way out
        return status
    finally:
        # Without this ~1 in 5 ZeRO-3 runs crash at exit (STACK.md).
        if dist.is_initialized():
            dist.destroy_process_group()


def _output_dir(run_json: str) -> str | None:
    """output_dir from a run.json that did not load as a config (so the failure file still lands)."""
    try:
        value = json.loads(Path(run_json).read_text()).get("output_dir")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def exit_now(status: int) -> None:
    """Leave with `status` once the run's files are written, without the interpreter's teardown: that teardown
    destroys the process groups and engines DeepSpeed still holds (AutoTP's and the pipeline's groups among them), and
    one of their C++ threads, still joinable then, aborted a rank of a finished tensor-parallel run ("terminate called
    without an active exception", exit -6) after its last checkpoint was committed. Everything of the run is closed
    by then (metrics, checkpoints, uploads are joined in fit), so only the standard streams and logging are flushed."""
    import logging
    import os

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_now(main())
