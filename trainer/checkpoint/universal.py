"""DeepSpeed's universal checkpoint: one step's ZeRO shards turned into per-parameter files that any number of
ranks can load (the resume across world sizes in trainer.checkpoint.checkpointer).

    to_universal(step / "ds", scratch / "ds")   # then the engine loads with load_universal=True
"""

from __future__ import annotations

import shutil
from argparse import Namespace
from pathlib import Path


def to_universal(ds_folder: Path, out_folder: Path) -> None:
    """DeepSpeed's universal checkpoint of one step's shards (ZeRO 1-3 with bf16): per-parameter fp32
    weights and Adam moments that any world size can load."""
    from deepspeed.checkpoint import ds_to_universal

    if out_folder.exists():
        shutil.rmtree(out_folder)
    # One worker: a process pool forked from a trainer that holds a process group is asking for trouble.
    args = Namespace(input_folder=str(ds_folder), output_folder=str(out_folder), num_extract_workers=1,
                     num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True)
    ds_to_universal.main(args)
