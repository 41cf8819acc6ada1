"""Code versions and version keys, as DESIGN.md "Recipes and versions" defines them.

- code_version = "<stage>:<sha256 of the code>[:12]:<sha256 of the recipe section>[:12]": the code is the source
  text of what the output depends on (assets/core/source_hash.py), so editing a filter step's code or a source's
  settings makes exactly the assets that use them stale. An output kept whatever its code (the trained
  tokenizer, until the recipe or the user asks for a new one) has "kept" in place of the code's digest.
- version_key = digest of the code version and everything the output depends on from outside the
  recipe (upstream data versions, input file fingerprints): the folder an output lives in. Outputs
  are immutable: a version key that already has a manifest is reused, never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path


def section_sha256(section) -> str:
    """Stable digest of a recipe section (any JSON-able value): key order does not matter."""
    blob = json.dumps(section, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def code_version(stage: str, code_sha256: str | None, section) -> str:
    return f"{stage}:{code_sha256[:12] if code_sha256 else 'kept'}:{section_sha256(section)[:12]}"


def file_fingerprints(paths: list[Path | str]) -> list[str]:
    """What each input's content is, without trusting its name: a local file's name, size and sha256 (streamed;
    remembered by path, size and modification time, so an unchanged crawl is not read again: `content_sha256`);
    a remote input (an fsspec URL, str) is its URL, size, ETag and modification time from the store's listing,
    nothing downloaded (an S3 ETag is the content's MD5, or its parts' for a multipart upload)."""
    prints = []
    for path in paths:
        if isinstance(path, Path):
            prints.append(f"{path.name}:{path.stat().st_size}:sha256:{content_sha256(path)}")
        else:
            from pipelines.inputs import input_info

            info = input_info(path)
            prints.append(f"{path}:{info['size']}:{info.get('etag', '')}:{info.get('mtime', '')}")
    return prints


HASH_CACHE = "sha256-cache.json"  # under $PRETRAIN_HOME/cache: {path: [size, mtime_ns, sha256]}
_CHUNK = 1 << 20


def content_sha256(path: Path) -> str:
    """sha256 of a local file, read in 1 MiB chunks; kept in $PRETRAIN_HOME/cache by (path, size, mtime_ns), so a
    file is read again only when it changes (a file replaced in place gets a new mtime)."""
    from assets.home import pretrain_home

    stat = path.stat()
    cache_file = pretrain_home() / "cache" / HASH_CACHE
    cache = _read_cache(cache_file)
    name = str(path.resolve())
    if cache.get(name, [None])[:2] == [stat.st_size, stat.st_mtime_ns]:
        return cache[name][2]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    cache = {**cache, name: [stat.st_size, stat.st_mtime_ns, digest.hexdigest()]}
    # Written whole and renamed: concurrent runs each leave a complete cache (one may lose the other's entry).
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache_file.with_name(f"{HASH_CACHE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(cache, sort_keys=True))
    os.replace(tmp, cache_file)
    return cache[name][2]


_LOADED: dict[Path, tuple[tuple[int, int], dict]] = {}  # cache file -> ((mtime_ns, size), its entries)


def _read_cache(cache_file: Path) -> dict:
    """The hash cache's entries, parsed again only when the file changed: observing 1,000 sources' inputs looks up
    thousands of files, and parsing the file for each was 2 s of every `pretrain status`."""
    try:
        stat = cache_file.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        if cache_file in _LOADED and _LOADED[cache_file][0] == stamp:
            return _LOADED[cache_file][1]
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        return {}
    _LOADED[cache_file] = (stamp, cache)
    return cache  # shared: content_sha256 writes a new dict, never into this one


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
