"""pipelines/inputs.py on the shared data's local files and against a real S3 server (moto on loopback, endpoint and credentials from the AWS_*
variables as a deployment sets them): globs, a missing URL named, info without a download, streamed reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.inputs import as_input, expand_inputs, expand_remote, input_info, input_name, open_input

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
CRAWL = DATA / "crawl"


def test_local_paths_globs_and_file_uris_expand_to_sorted_absolute_paths_without_repeats():
    specs = ["crawl/dolma_sample-*.warc.gz", f"file://{CRAWL / 'web-pages.warc.gz'}", "crawl/dolma_sample-0000.warc.gz"]
    found = expand_inputs(specs, DATA)
    assert [p.name for p in found] == ["dolma_sample-0000.warc.gz", "dolma_sample-0001.warc.gz", "web-pages.warc.gz"]
    assert all(p.is_absolute() for p in found)
    with pytest.raises(ValueError, match="crawl/nothing-\\*.warc.gz"):
        expand_inputs(["crawl/nothing-*.warc.gz"], DATA)
    with pytest.raises(ValueError, match="missing.jsonl"):
        expand_inputs(["missing.jsonl"], DATA)
    # URLs go to fsspec (tests/pipelines/test_inputs.py: S3); a scheme it does not know is named.
    with pytest.raises(ValueError, match="nosuchscheme://bucket/x.warc.gz"):
        expand_inputs(["nosuchscheme://bucket/x.warc.gz"], DATA)


def upload(s3, key: str, data: bytes) -> str:
    s3.client().put_object(Bucket=s3.bucket, Key=key, Body=data)
    return f"s3://{s3.bucket}/{key}"


def test_s3_globs_expand_to_sorted_files_and_mix_with_local_ones(s3):
    for key in ("crawl/b.warc.gz", "crawl/a.warc.gz", "crawl/sub/c.warc.gz", "crawl/notes.txt", "other/d.warc.gz"):
        upload(s3, key, b"x")
    bucket = f"s3://{s3.bucket}"
    assert sorted(expand_remote(f"{bucket}/crawl/*.warc.gz")) == [
        f"{bucket}/crawl/a.warc.gz", f"{bucket}/crawl/b.warc.gz"]
    assert sorted(expand_remote(f"{bucket}/crawl/**/*.warc.gz")) == [
        f"{bucket}/crawl/a.warc.gz", f"{bucket}/crawl/b.warc.gz", f"{bucket}/crawl/sub/c.warc.gz"]
    found = expand_inputs([f"{bucket}/crawl/*.warc.gz", f"{bucket}/other/d.warc.gz", "crawl/dolma_sample-0000.warc.gz",
                           f"{bucket}/crawl/a.warc.gz"], DATA)
    assert found == [CRAWL / "dolma_sample-0000.warc.gz", f"{bucket}/crawl/a.warc.gz", f"{bucket}/crawl/b.warc.gz",
                     f"{bucket}/other/d.warc.gz"]


def test_missing_s3_inputs_are_named(s3):
    upload(s3, "crawl/a.warc.gz", b"x")
    bucket = f"s3://{s3.bucket}"
    with pytest.raises(ValueError, match=f"input '{bucket}/crawl/missing.warc.gz' does not exist"):
        expand_inputs([f"{bucket}/crawl/missing.warc.gz"], DATA)
    with pytest.raises(ValueError, match=f"input pattern '{bucket}/crawl/\\*.wet.gz' matches no file"):
        expand_inputs([f"{bucket}/crawl/*.wet.gz"], DATA)
    with pytest.raises(ValueError, match=f"input '{bucket}/crawl' is a folder"):
        expand_inputs([f"{bucket}/crawl"], DATA)
    with pytest.raises(ValueError, match="s3://no-such-bucket-anywhere/x.warc.gz"):
        expand_inputs(["s3://no-such-bucket-anywhere/x.warc.gz"], DATA)


def test_info_gives_size_and_etag_without_a_download_and_reads_stream(s3):
    data = (CRAWL / "dolma_sample-0001.warc.gz").read_bytes()
    url = upload(s3, "crawl/dolma_sample-0001.warc.gz", data)
    info = input_info(url)
    assert info["size"] == len(data) and info["etag"]  # moto gives S3's ETag: the MD5 of a single-part upload
    assert input_info(url) == info
    upload(s3, "crawl/dolma_sample-0001.warc.gz", data[:-1])
    assert input_info(url)["etag"] != info["etag"]
    assert input_name(url) == "dolma_sample-0001.warc.gz"
    upload(s3, "crawl/dolma_sample-0001.warc.gz", data)
    with open_input(url) as f:
        assert f.read(3) == b"\x1f\x8b\x08"
        f.seek(len(data) - 10)
        assert f.read() == data[-10:]
        f.seek(0)
        assert f.read() == data


def test_local_inputs_stay_paths():
    path = CRAWL / "dolma_sample-0001.warc.gz"
    assert as_input(str(path)) == path and as_input(f"file://{path}") == path and as_input(path) is path
    assert as_input("s3://b/k") == "s3://b/k"
    assert input_info(path) == {"size": path.stat().st_size} and input_name(path) == path.name
    with open_input(path) as f:
        assert f.read() == path.read_bytes()
