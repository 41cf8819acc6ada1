"""Local scratch space: engines write here first, then the store commits the folder (manifest last)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from dagster import ConfigurableResource


class ScratchResource(ConfigurableResource):
    """A folder on local disk for work in progress (kept on failure, for inspection)."""

    root: str

    def version_dir(self, label: str, version_key: str) -> Path:
        """The one folder of this output version (root/resume/<label>/<version key>): a build killed half-way
        continues in it when materialized again."""
        return Path(self.root) / "resume" / label / version_key

    def new_dir(self, label: str) -> Path:
        root = Path(self.root)
        root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=label.replace("/", "-") + "-", dir=root))
