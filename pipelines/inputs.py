"""Where a source's inputs are: local paths, or fsspec URLs read without copying them to local disk first.

    expand_inputs(["crawl/*.warc.gz", "s3://bucket/crawl/*.warc.gz"], base_dir)   # [Path(...), "s3://...", ...]
    expand_remote("s3://bucket/crawl/*.warc.gz")   # ["s3://bucket/crawl/a.warc.gz", ...] (sorted by the caller)
    with open_input("s3://bucket/crawl/a.warc.gz") as f: ...   # seekable, streamed in 8 MiB read-ahead blocks
    input_info(Path("crawl/a.warc.gz"))            # {"size": 123}; remote: also "etag" and "mtime", no download

An input is a `Path` (local) or a URL string (`Input`). S3 goes through s3fs: the endpoint (AWS_ENDPOINT_URL_S3,
AWS_ENDPOINT_URL: MinIO, moto), credentials and region come from the usual AWS_* variables. A remote input reads
to the same records, origins included, as the same file on disk: origins use the file name (`input_name`).
A recipe's inputs (paths and globs relative to its base_dir, file:// URIs, URLs) become the list of inputs with
`expand_inputs`.
"""

from __future__ import annotations

import os
import re
from glob import glob
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO
from urllib.parse import unquote, urlparse

Input = Path | str  # a local file (or folder) or an fsspec URL ("s3://bucket/key")

URL_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]+://")
GLOB_CHARS = re.compile(r"[*?[]")
REMOTE_BLOCK_BYTES = 8 << 20  # fsspec read-ahead per remote file: one ranged request per 8 MiB streamed


def expand_inputs(inputs: list[str], base_dir) -> list[Input]:
    """Paths, globs (relative to base_dir; ** recurses), file:// URIs or fsspec URLs (s3://bucket/crawl/*.warc.gz)
    -> the existing inputs, sorted, no repeats: local ones as absolute Paths, remote ones as URLs (str)."""
    base = Path(base_dir)
    found: set[Input] = set()
    for spec in inputs:
        text = str(spec)
        if text.startswith("file://"):
            uri = urlparse(text)
            if uri.netloc not in ("", "localhost"):
                raise ValueError(f"input {spec!r}: a file:// URI must name an absolute local path (file:///...)")
            text = unquote(uri.path)
        elif URL_SCHEME.match(text):
            found.update(expand_remote(text))
            continue
        pattern = str(base / Path(text).expanduser())
        if GLOB_CHARS.search(text):
            matches = [Path(p) for p in glob(pattern, recursive=True)]
            if not matches:
                raise ValueError(f"input pattern {spec!r} matches nothing (looked in {base})")
            found.update(Path(os.path.abspath(p)) for p in matches)
        elif os.path.exists(pattern):
            found.add(Path(os.path.abspath(pattern)))
        else:
            raise ValueError(f"input {spec!r} does not exist (looked for {pattern})")
    return sorted(found, key=str)


def expand_remote(url: str) -> list[str]:
    """An fsspec URL -> the files it names (a glob: those it matches; folders are not inputs). A URL that names
    nothing, or that cannot be listed (no backend for its scheme, no such bucket, no access), is a ValueError
    naming it."""
    try:
        fs, path = remote_fs(url)
        # fsspec keeps listings in its (per-process, cached) filesystem: list afresh, so that a file replaced since
        # is seen; input_info then takes sizes and ETags from this listing instead of one request per file.
        fs.invalidate_cache()
        if GLOB_CHARS.search(path):
            matches = [m for m, info in fs.glob(path, detail=True).items() if info.get("type") != "directory"]
            kind = "glob"
        else:
            matches = [path] if fs.isfile(path) else []
            kind = "folder" if not matches and fs.isdir(path) else "file"
    except Exception as exc:  # a missing backend (ImportError), credentials, network, an unknown protocol
        detail = f"{type(exc).__name__}: {exc}"
        raise ValueError(f"input {url!r} could not be listed: {detail[:300]}") from exc
    if not matches:
        raise ValueError({"glob": f"input pattern {url!r} matches no file",
                          "folder": f"input {url!r} is a folder (give a glob, e.g. .../*.warc.gz)",
                          "file": f"input {url!r} does not exist"}[kind])
    return [fs.unstrip_protocol(m) for m in matches]


def remote_fs(url: str):
    """(fsspec filesystem, path inside it) for a URL. S3: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL name an
    S3-compatible server (MinIO, moto), addressed path-style; credentials and region come from the AWS_*
    variables through botocore."""
    import fsspec.core

    options: dict[str, Any] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if url.startswith(("s3://", "s3a://")) and endpoint:
        options = {"client_kwargs": {"endpoint_url": endpoint}, "config_kwargs": {"s3": {"addressing_style": "path"}}}
    return fsspec.core.url_to_fs(url, **options)


def input_name(location: Input) -> str:
    """The file name of an input ("web-pages.warc.gz"), local or remote: what record origins start with."""
    if isinstance(location, Path):
        return location.name
    return PurePosixPath(urlparse(location).path).name


def input_info(location: Input) -> dict:
    """{"size", and for a remote file "etag" and "mtime" where its store gives them} -- without reading it."""
    if isinstance(location, Path):
        return {"size": location.stat().st_size}
    fs, path = remote_fs(location)
    info = fs.info(path)
    found = {"size": int(info["size"])}
    for field, keys in (("etag", ("ETag", "etag")), ("mtime", ("mtime", "LastModified", "last_modified"))):
        value = next((info[key] for key in keys if info.get(key) is not None), None)
        if value is not None:
            found[field] = str(value).strip('"')
    return found


def open_input(location: Input) -> BinaryIO:
    """A seekable binary file: a local one, or a remote one streamed in REMOTE_BLOCK_BYTES read-ahead blocks."""
    if isinstance(location, Path):
        return open(location, "rb")
    fs, path = remote_fs(location)
    return fs.open(path, "rb", block_size=REMOTE_BLOCK_BYTES, cache_type="readahead")


def as_input(location) -> Input:
    """A Path, a path string or a URL -> Path (local) or str (URL), as the readers take it."""
    if isinstance(location, Path):
        return location
    text = str(location)
    if text.startswith("file://"):
        return Path(unquote(urlparse(text).path))
    return text if URL_SCHEME.match(text) else Path(text)


