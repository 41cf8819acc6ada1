"""The commit protocol: an output is a folder of objects whose `manifest.json`, written last, commits it.

    from storage.factory import open_store
    from storage.manifest import commit_folder, read_manifest
    store = open_store("s3://bucket/prefix")          # or a local path / file:// URI
    manifest = commit_folder(store, "curation/web/filtered/9f3c", work_dir, {"asset": ...})
    read_manifest(store, "curation/web/filtered/9f3c")  # None while the output is missing or incomplete

`commit_folder` writes the manifest after every file, so a reader never sees a half-written output.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from storage.objects import ObjectNotFoundError, ObjectStore, check_key, join_key

MANIFEST = "manifest.json"
SAMPLE_BLOCK_BYTES = 1 << 20
SAMPLE_BLOCKS = 3  # start, middle, end


def data_version_of(files: list[dict]) -> str:
    """Digest of an output's content: sha256 of the sorted "path:sha256" lines of its manifest files."""
    lines = sorted(f"{entry['path']}:{entry['sha256']}\n" for entry in files)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def commit_folder(store: ObjectStore, prefix: str, local_dir: str | os.PathLike, manifest: dict) -> dict:
    """Upload every file under `local_dir` to `prefix/`, then write `prefix/manifest.json` last.

    The manifest is the commit marker: if any upload fails the exception propagates and no manifest
    is written, so readers (read_manifest) keep seeing the output as missing. Per-file fields already
    in manifest["files"] (e.g. "records") are kept; "bytes" and "sha256" come from the upload.
    `manifest` is completed in place ("files", "data_version") and returned.
    """
    local_dir = Path(local_dir)
    if not local_dir.is_dir():
        raise ValueError(f"commit_folder: {local_dir} is not a folder")
    manifest_key = join_key(prefix, MANIFEST)

    paths = []
    for dirpath, dirnames, filenames in os.walk(local_dir):
        dirnames.sort()
        paths += [Path(dirpath, name) for name in filenames if Path(dirpath, name).is_file()]
    relpaths = sorted(path.relative_to(local_dir).as_posix() for path in paths)
    if MANIFEST in relpaths:
        raise ValueError(f"commit_folder: {local_dir / MANIFEST} would be overwritten by the commit marker; rename it")
    # Check every key and the given entries before uploading anything, so bad input uploads nothing.
    for rel in relpaths:
        check_key(join_key(prefix, rel))
    given = {entry["path"]: entry for entry in manifest.get("files") or []}
    unknown = sorted(set(given) - set(relpaths))
    if unknown:
        raise ValueError(f"commit_folder: manifest lists files that are not in {local_dir}: {unknown}")

    files = []
    for rel in relpaths:
        info = store.put_file(join_key(prefix, rel), local_dir / rel)
        files.append({**given.get(rel, {}), "path": rel, "bytes": info.bytes, "sha256": info.sha256})
    manifest["files"] = files
    manifest["data_version"] = data_version_of(files)
    store.put_bytes(manifest_key, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    return manifest


def read_manifest(store: ObjectStore, prefix: str) -> dict | None:
    """The committed manifest of `prefix`, or None when the output is missing or incomplete."""
    try:
        return json.loads(store.get_bytes(join_key(prefix, MANIFEST)))
    except ObjectNotFoundError:
        return None


def sampled_blocks(size: int) -> list[tuple[int, int]]:
    """(offset, length) of the blocks hashed in a file of `size` bytes: start, middle and end, or the whole file
    when it is no larger than those blocks together."""
    if size <= SAMPLE_BLOCK_BYTES * SAMPLE_BLOCKS:
        return [(0, size)]
    last = size - SAMPLE_BLOCK_BYTES
    return [(offset, SAMPLE_BLOCK_BYTES) for offset in (0, last // 2, last)]


def sampled_sha256(path: Path) -> str:
    """sha256 of the file's size and of its sampled blocks (sampled_blocks): a check of a large local copy that
    costs the same at any size (the trainer's shards at every start), where the manifest's full sha256 is what the
    store's download already checked."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        for offset, length in sampled_blocks(size):
            f.seek(offset)
            digest.update(f.read(length))
    return digest.hexdigest()
