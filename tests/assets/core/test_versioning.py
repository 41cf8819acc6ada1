"""assets/core/versioning.py: the recipe-section digest, the code version and the version key, computed by hand
(sha256 of compact, key-sorted JSON) and checked to move with exactly the inputs they depend on."""

import hashlib
import json
import os
import re

from assets.core.versioning import (
    HASH_CACHE,
    code_version,
    content_sha256,
    file_fingerprints,
    manifest_header,
    section_sha256,
    version_key,
)


def sha(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_section_digest_is_sha256_of_sorted_compact_json_and_ignores_key_order():
    section = {"b": [1, 2], "a": {"y": 0.5, "x": None}}
    assert section_sha256(section) == sha(section)
    assert section_sha256(section) == section_sha256({"a": {"x": None, "y": 0.5}, "b": [1, 2]})
    assert section_sha256(section) != section_sha256({"b": [2, 1], "a": {"y": 0.5, "x": None}})  # list order counts
    # Anything not JSON-able is taken by its str() (a Path in a section).
    from pathlib import Path
    assert section_sha256({"p": Path("/x/y")}) == sha({"p": "/x/y"})


def test_code_version_is_stage_twelve_hex_of_the_code_and_twelve_hex_of_the_section():
    section, code = {"threshold": 0.5}, hashlib.sha256(b"def f(): pass").hexdigest()
    assert code_version("filtered", code, section) == f"filtered:{code[:12]}:{sha(section)[:12]}"
    assert re.fullmatch(r"[a-z]+:[0-9a-f]{12}:[0-9a-f]{12}", code_version("filtered", code, section))
    assert code_version("filtered", code, section) != code_version("filtered", "0" * 64, section)
    assert code_version("filtered", code, section) != code_version("packed", code, section)
    assert code_version("filtered", code, section) != code_version("filtered", code, {"threshold": 0.6})
    # An output kept whatever its code (the trained tokenizer) follows its section alone.
    assert code_version("tokenizer", None, section) == f"tokenizer:kept:{sha(section)[:12]}"


def test_version_key_by_hand_and_it_follows_each_of_its_inputs():
    cv, up, fp = "filtered:v1:abcdef012345", {"curation/web/raw_crawl": "d1"}, ["a.jsonl:10"]
    key = version_key(cv, upstream=up, inputs=fp)
    assert key == sha({"code_version": cv, "upstream": up, "inputs": fp})[:16]
    assert len(key) == 16
    assert version_key(cv, upstream=up, inputs=fp) == key  # deterministic
    changed = [
        version_key("filtered:v1:abcdef012346", upstream=up, inputs=fp),
        version_key(cv, upstream={"curation/web/raw_crawl": "d2"}, inputs=fp),
        version_key(cv, upstream={"curation/code/raw_crawl": "d1"}, inputs=fp),
        version_key(cv, upstream=up, inputs=["a.jsonl:11"]),
        version_key(cv, upstream=up, inputs=["b.jsonl:10"]),
        version_key(cv, upstream=up, inputs=[*fp, "c.txt:1"]),
    ]
    assert key not in changed and len(set(changed)) == len(changed)
    # The order of the upstream mapping is not an input; None and empty are the same thing.
    two = {"a": "1", "b": "2"}
    assert version_key(cv, upstream=two) == version_key(cv, upstream=dict(reversed(two.items())))
    assert version_key(cv) == version_key(cv, upstream={}, inputs=[]) == sha(
        {"code_version": cv, "upstream": {}, "inputs": []})[:16]


def test_local_fingerprints_are_name_size_and_content_sha256_cached_by_size_and_mtime(tmp_path, pretrain_home):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"\0" * 1234)
    a_sha, b_sha = hashlib.sha256(b"hello").hexdigest(), hashlib.sha256(b"\0" * 1234).hexdigest()
    assert file_fingerprints([tmp_path / "a.txt", tmp_path / "sub" / "b.bin"]) == [
        f"a.txt:5:sha256:{a_sha}", f"b.bin:1234:sha256:{b_sha}"]
    assert file_fingerprints([]) == []
    cache = json.loads((pretrain_home / "cache" / HASH_CACHE).read_text())
    assert cache[str(tmp_path / "a.txt")][2] == a_sha
    # Replaced in place with the same size: a new mtime, so it is read again and the fingerprint changes.
    (tmp_path / "a.txt").write_text("jello")
    os.utime(tmp_path / "a.txt", ns=(1, 1))
    assert file_fingerprints([tmp_path / "a.txt"]) == [f"a.txt:5:sha256:{hashlib.sha256(b'jello').hexdigest()}"]
    # The cache is what an unchanged file's digest comes from: an entry for its size and mtime is believed.
    stat = (tmp_path / "a.txt").stat()
    cache = json.loads((pretrain_home / "cache" / HASH_CACHE).read_text())
    cache[str(tmp_path / "a.txt")] = [stat.st_size, stat.st_mtime_ns, "f" * 64]
    (pretrain_home / "cache" / HASH_CACHE).write_text(json.dumps(cache))
    assert content_sha256(tmp_path / "a.txt") == "f" * 64


def test_s3_fingerprints_are_url_size_and_etag_without_a_download(s3):
    url = f"s3://{s3.bucket}/crawl/a.warc.gz"
    s3.client().put_object(Bucket=s3.bucket, Key="crawl/a.warc.gz", Body=b"hello")
    etag = s3.client().head_object(Bucket=s3.bucket, Key="crawl/a.warc.gz")["ETag"].strip('"')
    [printed] = file_fingerprints([url])
    assert printed.startswith(f"{url}:5:{etag}:") and printed.split(f"{etag}:", 1)[1]  # URL, size, ETag, mtime
    s3.client().put_object(Bucket=s3.bucket, Key="crawl/a.warc.gz", Body=b"hellO")  # same size, new content
    assert file_fingerprints([url]) != [printed]


def test_manifest_header_names_the_asset_versions_section_digest_run_and_time():
    section = {"k": [1, 2]}
    header = manifest_header(["curation", "web", "filtered"], "0123456789abcdef", "filtered:v1:x", section, "run-1")
    created = header.pop("created")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created)
    assert header == {"asset": "curation/web/filtered", "version_key": "0123456789abcdef",
                      "code_version": "filtered:v1:x", "recipe_section_sha256": sha(section), "run_id": "run-1"}
