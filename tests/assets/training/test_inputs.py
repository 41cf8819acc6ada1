"""assets/training/inputs.py: what a trainer reads (each source's packed output and the tokenizer), resolved from
the latest materializations against a LocalStore and an ephemeral instance; the folders (in place for a local
store, a verified cache by data version otherwise), the upstream versions, the tokenizer hash and the lineage.

`committed` and `context_for` are shared by the training, mixing and evaluation unit tests."""

import json
import logging
from types import SimpleNamespace

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance

from assets.core.upstream import Output, OutputNotFound
from assets.training.inputs import TrainingInputs, local_folder, packed_keys, training_inputs
from resources.scratch import ScratchResource
from storage.local import LocalStore
from storage.manifest import MANIFEST, commit_folder


def committed(instance, store, tmp_path, key: AssetKey, files: dict[str, str], fields: dict | None = None,
              name: str = "v1") -> Output:
    """Commit `files` as the output of `key` and record its materialization as the factory does."""
    prefix = "/".join([*key.path, name])
    folder = tmp_path / "outputs" / prefix
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    manifest = commit_folder(store, prefix, folder, {"asset": key.to_user_string(), "code_version": f"{key.path[-1]}:v1:x",
                                                     "run_id": f"run-{name}", "upstream": {}, **(fields or {})})
    instance.report_runless_asset_event(AssetMaterialization(
        asset_key=key, metadata={"prefix": prefix}, tags={"dagster/data_version": manifest["data_version"]}))
    return Output(key, prefix, manifest)


def context_for(instance, tmp_path, **resources):
    return SimpleNamespace(instance=instance, log=logging.getLogger("test"), op_config={}, retry_number=0,
                           resources=SimpleNamespace(scratch=ScratchResource(root=str(tmp_path / "work")), **resources),
                           run=SimpleNamespace(run_id="test-run"))


def packed(instance, store, tmp_path, sources, tokenizer_sha="t" * 64):
    outs = {s: committed(instance, store, tmp_path, AssetKey(["tokenization", s, "packed"]),
                         {"train.bin": f"{s} tokens", "val.bin": f"{s} val"}) for s in sources}
    tok = committed(instance, store, tmp_path, AssetKey(["tokenization", "tokenizer"]), {"tokenizer.json": "{}"},
                    {"tokenizer": {"sha256": tokenizer_sha}})
    return outs, tok


@pytest.fixture
def world(tmp_path):
    instance = DagsterInstance.ephemeral()
    yield instance, LocalStore(tmp_path / "store")
    instance.dispose()


def test_packed_keys_are_each_sources_packed_then_the_tokenizer():
    assert packed_keys(["web", "code"]) == [AssetKey(["tokenization", "web", "packed"]),
                                            AssetKey(["tokenization", "code", "packed"]),
                                            AssetKey(["tokenization", "tokenizer"])]


def test_training_inputs_from_the_latest_outputs(world, tmp_path):
    instance, store = world
    outs, tok = packed(instance, store, tmp_path, ["web", "code"])
    found = training_inputs(context_for(instance, tmp_path), store, ScratchResource(root=str(tmp_path / "work")),
                            ["web", "code"])
    assert isinstance(found, TrainingInputs)
    # A local store is read in place: the committed folders themselves.
    assert found.folders == {"web": tmp_path / "store" / outs["web"].prefix, "code": tmp_path / "store" / outs["code"].prefix}
    assert (found.folders["web"] / MANIFEST).is_file()
    assert found.outputs == outs and found.tokenizer == tok
    assert found.upstream == {"tokenization/web/packed": outs["web"].data_version,
                              "tokenization/code/packed": outs["code"].data_version,
                              "tokenization/tokenizer": tok.data_version}
    assert found.tokenizer_sha256 == "t" * 64
    assert [(r["asset"], r["data_version"], r["prefix"], r["run_id"]) for r in found.lineage] == [
        (o.key.to_user_string(), o.data_version, o.prefix, "run-v1") for o in (outs["web"], outs["code"], tok)]


def test_a_missing_packed_output_is_output_not_found(world, tmp_path):
    instance, store = world
    packed(instance, store, tmp_path, ["web"])
    with pytest.raises(OutputNotFound, match="tokenization/code/packed has never been materialized"):
        training_inputs(context_for(instance, tmp_path), store, ScratchResource(root=str(tmp_path / "work")),
                        ["web", "code"])


class RemoteStore(LocalStore):
    """A store that is not on this machine (as S3 is): no local paths, downloads counted."""

    downloads = 0

    def local_path(self, key):
        return None

    def download(self, key, path):
        RemoteStore.downloads += 1
        return super().download(key, path)


def test_a_remote_output_is_downloaded_once_into_a_cache_by_data_version(world, tmp_path):
    instance, _ = world
    store = RemoteStore(tmp_path / "store")
    [out] = packed(instance, store, tmp_path, ["web"])[0].values()
    cache = tmp_path / "cache"
    folder = local_folder(store, out, cache)
    assert folder == cache / out.data_version
    assert (folder / "train.bin").read_text() == "web tokens" and (folder / "val.bin").read_text() == "web val"
    assert json.loads((folder / MANIFEST).read_text()) == out.manifest
    assert RemoteStore.downloads == 2
    assert local_folder(store, out, cache) == folder and RemoteStore.downloads == 2  # cached: nothing fetched
    assert [p.name for p in cache.iterdir()] == [out.data_version]  # no partial folder left
