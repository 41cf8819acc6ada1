"""assets/core/upstream.py against a LocalStore and an ephemeral Dagster instance: the latest materialization's
prefix finds the committed output; a never-materialized asset, a materialization without a prefix and a folder
without a manifest (uploaded but never committed) are OutputNotFound; committed_result carries the manifest's
data version and the output's location."""

import gzip
import hashlib

import pytest
from dagster import AssetCheckResult, AssetKey, AssetMaterialization, DagsterInstance, DataVersion

from assets.core.upstream import Output, OutputNotFound, committed_result, latest_output, output_at, output_location
from storage.local import LocalStore
from storage.manifest import commit_folder

KEY = AssetKey(["curation", "web", "raw_crawl"])


@pytest.fixture
def world(tmp_path):
    store = LocalStore(tmp_path / "store")
    instance = DagsterInstance.ephemeral()
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "part-00000.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a", "id": "1"}\n'))
    (folder / "part-00001.jsonl.gz").write_bytes(gzip.compress(b'{"text": "b", "id": "2"}\n'))
    (folder / "rejected.jsonl.gz").write_bytes(gzip.compress(b""))
    manifest = commit_folder(store, "curation/web/raw_crawl/v1", folder, {"asset": KEY.to_user_string()})
    # An output whose files were uploaded but whose manifest was never written: not committed.
    store.put_bytes("curation/web/raw_crawl/v2/part-00000.jsonl.gz", b"half")
    yield store, instance, manifest
    instance.dispose()


def materialized(instance, metadata: dict) -> None:
    instance.report_runless_asset_event(AssetMaterialization(asset_key=KEY, metadata=metadata))


def test_latest_output_reads_the_committed_folder_named_by_the_latest_materialization(world, tmp_path):
    store, instance, manifest = world
    materialized(instance, output_location(store, "curation/web/raw_crawl/v1"))
    out = latest_output(instance, store, KEY)
    assert out == Output(KEY, "curation/web/raw_crawl/v1", manifest)
    assert out.data_version == manifest["data_version"]
    assert out.files() == ["curation/web/raw_crawl/v1/part-00000.jsonl.gz", "curation/web/raw_crawl/v1/part-00001.jsonl.gz"]
    assert out.files("rejected") == ["curation/web/raw_crawl/v1/rejected.jsonl.gz"]
    paths = out.download(store, tmp_path / "dl")
    assert [p.name for p in paths] == ["part-00000.jsonl.gz", "part-00001.jsonl.gz"]
    assert gzip.decompress(paths[1].read_bytes()) == b'{"text": "b", "id": "2"}\n'
    # The data version is the sha256 of the sorted "path:sha256" lines of the files.
    lines = sorted(f"{f['path']}:{hashlib.sha256((tmp_path / 'out' / f['path']).read_bytes()).hexdigest()}\n"
                   for f in manifest["files"])
    assert out.data_version == hashlib.sha256("".join(lines).encode()).hexdigest()


def test_a_later_materialization_of_an_uncommitted_folder_is_not_found(world):
    store, instance, _ = world
    materialized(instance, output_location(store, "curation/web/raw_crawl/v1"))
    materialized(instance, output_location(store, "curation/web/raw_crawl/v2"))
    with pytest.raises(OutputNotFound, match=r"raw_crawl/v2 has no manifest: the output of curation/web/raw_crawl is missing"):
        latest_output(instance, store, KEY)
    assert output_at(store, KEY, "curation/web/raw_crawl/v1").prefix == "curation/web/raw_crawl/v1"


def test_never_materialized_or_without_a_prefix_names_the_command(world):
    store, instance, _ = world
    message = r"curation/web/raw_crawl has never been materialized: run `pretrain materialize --select curation/web/raw_crawl`"
    with pytest.raises(OutputNotFound, match=message):
        latest_output(instance, store, KEY)
    materialized(instance, {"documents": 3})  # a materialization that does not say where its output is
    with pytest.raises(OutputNotFound, match=message):
        latest_output(instance, store, KEY)
    assert issubclass(OutputNotFound, LookupError)


def test_committed_result_carries_the_data_version_location_and_metadata(world):
    store, _, manifest = world
    check = AssetCheckResult(passed=True, check_name="documents_valid")
    result = committed_result(store, "curation/web/raw_crawl/v1", manifest, metadata={"documents": 2},
                              check_results=[check])
    assert result.data_version == DataVersion(manifest["data_version"])
    assert result.metadata["prefix"] == "curation/web/raw_crawl/v1"
    assert result.metadata["uri"].value == store.uri("curation/web/raw_crawl/v1")
    assert result.metadata["documents"] == 2
    assert list(result.check_results) == [check]
