"""`python -m assets.cli ...`: the `pretrain` command (the tests and benchmarks start it so)."""

import sys

from assets.cli.command import main

sys.exit(main())
