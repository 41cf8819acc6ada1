"""Local scratch space: engines write here first, then the store commits the folder (manifest last)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from dagster import ConfigurableResource


class ScratchResource(ConfigurableResource):
    """A folder on local disk for work in progress (kept on failure, for inspection)."""

    root: str

    def new_dir(self, label: str) -> Path:
        root = Path(self.root)
        root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=label.replace("/", "-") + "-", dir=root))
