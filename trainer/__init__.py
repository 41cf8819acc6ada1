"""trainer package: the training engine (`python -m trainer --config run.json`, trainer/__main__.py)."""

import time

# When this process began importing the trainer: a trainer process's start-up (imports, DeepSpeed's ops, the
# engine build, a resume's load) is measured from here and logged as the `startup` event (trainer.train).
IMPORTED_AT = time.perf_counter()
