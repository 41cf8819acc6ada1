"""Train from a run config:

    python -m trainer --config run.json
    torchrun --nproc_per_node 2 -m trainer --config run.json
    deepspeed --num_gpus 2 --module trainer --config run.json

Exit status 0 when the token budget is reached, 3 when the spike guard stops the run (a rollback
with no checkpoint before the spike, or too many skipped steps), 2 for a bad config or a checkpoint
this config cannot resume (e.g. another batch.global_batch), 4 when the step watchdog ended a hang
(trainer.watchdog: <output_dir>/failure.json says which rank and step; a restart resumes), 5 when one
rank gave corrupt figures too often (trainer.rank_checks; restarting on the same node cannot help),
6 when it stopped (checkpointed) so the launcher restarts it without a straggler's node (straggler.drain).
Every failure also writes <output_dir>/failure.json ({kind, exit_status, message, ...}): under torchrun
the launcher sees torchrun's own exit status (1), so that file is how it knows what happened.
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
    from trainer.watchdog import write_failure

    def failed(status: int, kind: str, e: Exception, output_dir: str | None, **extra) -> int:
        print(f"error: {e}", file=sys.stderr)
        if output_dir:
            write_failure(output_dir, {"kind": kind, "exit_status": status, "message": str(e), **extra})
        return status

    try:
        cfg = load_run_config(args.config)
    except ValueError as e:
        return failed(2, "config", e, _output_dir(args.config))

    import torch.distributed as dist

    from trainer.checkpoint import ResumeRefused
    from trainer.guard import GuardStop
    from trainer.rank_checks import DRAIN_EXIT, SDC_EXIT, DrainRequested, SDCStop
    from trainer.train import train

    try:
        train(cfg)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()  # no rank tears its process group down while another still uses it
        return 0
    except ResumeRefused as e:
        return failed(2, "config", e, cfg.output_dir)
    except GuardStop as e:
        return failed(3, "guard_stop", e, cfg.output_dir)
    except SDCStop as e:
        return failed(SDC_EXIT, "sdc", e, cfg.output_dir, rank=e.rank, host=e.host)
    except DrainRequested as e:
        return failed(DRAIN_EXIT, "straggler", e, cfg.output_dir, rank=e.rank, host=e.host)
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


if __name__ == "__main__":
    sys.exit(main())
