"""Code versions and version keys, as DESIGN.md "Recipes and versions" defines them.

- code_version = "<stage>:<implementation version>:<sha256 of the recipe section>[:12]", so changing a
  source's settings makes exactly the assets that read that section stale.
- version_key = digest of the code version and everything the output depends on from outside the
  recipe (upstream data versions, input file fingerprints): the folder an output lives in. Outputs
  are immutable: a version key that already has a manifest is reused, never overwritten.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
import json
from pathlib import Path


def section_sha256(section) -> str:
    """Stable digest of a recipe section (any JSON-able value): key order does not matter."""
    blob = json.dumps(section, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def code_version(stage: str, implementation: str, section) -> str:
    return f"{stage}:{implementation}:{section_sha256(section)[:12]}"


def file_fingerprints(paths: list[Path | str]) -> list[str]:
    """Name and size of each local input: enough to notice a replaced file without hashing gigabytes. A remote
    input (an fsspec URL, str) is its URL, size and ETag (or modification time, where the store has no ETag),
    from the store's listing: nothing is downloaded."""
    prints = []
    for path in paths:
        if isinstance(path, Path):
            prints.append(f"{path.name}:{path.stat().st_size}")
        else:
            from pipelines.inputs import input_info

            info = input_info(path)
            version = info.get("etag") or info.get("mtime", "")
            prints.append(f"{path}:{info['size']}:{version}")
    return prints


def version_key(code_version: str, *, upstream: dict[str, str] | None = None, inputs: list[str] | None = None) -> str:
    material = {"code_version": code_version, "upstream": upstream or {}, "inputs": inputs or []}
    return section_sha256(material)[:16]


def manifest_header(key_path: list[str], version_key: str, code_version: str, section, run_id: str) -> dict:
    """The fields every output manifest starts with (DESIGN.md "Contracts in detail")."""
    return {
        "asset": "/".join(key_path),
        "version_key": version_key,
        "code_version": code_version,
        "recipe_section_sha256": section_sha256(section),
        "run_id": run_id,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
