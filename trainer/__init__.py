"""trainer package: the training engine (`python -m trainer --config run.json`, trainer/__main__.py)."""

import os
import sys
import time

# When this process began importing the trainer: a trainer process's start-up (imports, DeepSpeed's ops, the
# engine build, a resume's load) is measured from here and logged as the `startup` event (trainer.train).
IMPORTED_AT = time.perf_counter()

# DeepSpeed's CPU comm op (deepspeed_shm_comm) is compiled once, by `make install`, into the venv's torch_extensions
# folder. Every process that imports the trainer loads it from there, however it was started: make, `pretrain`, an
# asset, or a bare `python -m trainer`. Unset, TORCH_EXTENSIONS_DIR means ~/.cache/torch_extensions, where each new
# HOME built the op again (~35 s of the first start), and two trainers started side by side built it at once. A
# folder the user set is kept.
if not os.environ.get("TORCH_EXTENSIONS_DIR"):
    os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(sys.prefix, "torch_extensions")
