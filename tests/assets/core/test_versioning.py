"""assets/core/versioning.py: the recipe-section digest, the code version and the version key, computed by hand
(sha256 of compact, key-sorted JSON) and checked to move with exactly the inputs they depend on."""

import hashlib
import json
import re

from assets.core.versioning import code_version, file_fingerprints, manifest_header, section_sha256, version_key


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


def test_code_version_is_stage_implementation_and_twelve_hex_of_the_section():
    section = {"threshold": 0.5}
    assert code_version("filtered", "v2", section) == f"filtered:v2:{sha(section)[:12]}"
    assert re.fullmatch(r"[a-z]+:v2:[0-9a-f]{12}", code_version("filtered", "v2", section))
    assert code_version("filtered", "v2", section) != code_version("filtered", "v3", section)
    assert code_version("filtered", "v2", section) != code_version("packed", "v2", section)
    assert code_version("filtered", "v2", section) != code_version("filtered", "v2", {"threshold": 0.6})


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


def test_file_fingerprints_are_name_and_size(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"\0" * 1234)
    assert file_fingerprints([tmp_path / "a.txt", tmp_path / "sub" / "b.bin"]) == ["a.txt:5", "b.bin:1234"]
    assert file_fingerprints([]) == []


def test_s3_fingerprints_are_url_size_and_etag_without_a_download(s3):
    url = f"s3://{s3.bucket}/crawl/a.warc.gz"
    s3.client().put_object(Bucket=s3.bucket, Key="crawl/a.warc.gz", Body=b"hello")
    etag = s3.client().head_object(Bucket=s3.bucket, Key="crawl/a.warc.gz")["ETag"].strip('"')
    assert file_fingerprints([url]) == [f"{url}:5:{etag}"]
    s3.client().put_object(Bucket=s3.bucket, Key="crawl/a.warc.gz", Body=b"hellO")  # same size, new content
    assert file_fingerprints([url]) != [f"{url}:5:{etag}"]


def test_manifest_header_names_the_asset_versions_section_digest_run_and_time():
    section = {"k": [1, 2]}
    header = manifest_header(["curation", "web", "filtered"], "0123456789abcdef", "filtered:v1:x", section, "run-1")
    created = header.pop("created")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created)
    assert header == {"asset": "curation/web/filtered", "version_key": "0123456789abcdef",
                      "code_version": "filtered:v1:x", "recipe_section_sha256": sha(section), "run_id": "run-1"}
