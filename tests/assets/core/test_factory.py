"""The asset factory's reuse-or-build sequence against a local store: reuse, rebuild of a missing output, a missing
upstream output, a failing build, and the manifest's recipe section digest."""

import hashlib
import json

import pytest
from dagster import AssetCheckResult, AssetCheckSpec, AssetKey, DagsterInstance, materialize

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import OutputNotFound
from resources.scratch import ScratchResource
from resources.store_resource import StoreResource
from storage.manifest import MANIFEST
from storage.local import LocalStore

KEY = AssetKey(["test", "thing"])
SECTION = {"threshold": 0.5, "names": ["a", "b"]}


class Builds:
    """A build that writes one file and counts its calls."""

    def __init__(self, fail: Exception | None = None):
        self.calls = 0
        self.fail = fail

    def __call__(self, inputs: Inputs, out_dir):
        self.calls += 1
        (out_dir / "part-00000.txt").write_text(f"built for {inputs.version_key}")
        if self.fail is not None:
            raise self.fail
        return {"counts": {"kept": 1}}


def _asset(build, **spec):
    return output_asset(OutputSpec(
        key=KEY, group="test", stage="thing", section=SECTION, description="a test asset",
        build=build, metadata=lambda inputs, output: {"kept": output.manifest["counts"]["kept"]}, **spec))


class StepFailed(Exception):
    """The run failed; the message is the step's error, as the UI and the CLI show it."""


@pytest.fixture
def run(tmp_path):
    """Materialize an asset in a run of its own against a local store; its materialization (or StepFailed)."""
    instance = DagsterInstance.ephemeral()
    resources = {"store": StoreResource(url=str(tmp_path / "store")), "scratch": ScratchResource(root=str(tmp_path / "work"))}

    def materialize_one(asset):
        result = materialize([asset], resources=resources, instance=instance, raise_on_error=False)
        if not result.success:
            [failure] = result.get_step_failure_events()
            error, chain = failure.step_failure_data.error, []
            while error is not None:  # Dagster wraps what the asset raised: its cause is the asset's own error
                chain.append(f"{error.cls_name}: {error.message.strip()}")
                error = error.cause
            raise StepFailed("\n".join(chain))
        [materialization] = result.asset_materializations_for_node(asset.op.name)
        return result, {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}

    yield materialize_one
    instance.dispose()


def test_an_output_is_built_once_and_then_reused(run, tmp_path):
    build = Builds()
    asset = _asset(build)
    (_, first), (_, second) = run(asset), run(asset)
    assert build.calls == 1
    assert first == second
    assert first["kept"] == 1 and first["prefix"] == f"test/thing/{first['version_key']}"
    manifest = json.loads((tmp_path / "store" / first["prefix"] / MANIFEST).read_text())
    assert manifest["data_version"] == first["data_version"]
    assert [f["path"] for f in manifest["files"]] == ["part-00000.txt"]
    assert manifest["upstream"] == {} and manifest["counts"] == {"kept": 1} and manifest["code_version"].startswith("thing:")
    assert 0 <= manifest["seconds"] < 60  # the build's wall time, recorded when the build states none
    # The digest of the section the code version was made from, computed here without the project's helper.
    expected = hashlib.sha256(json.dumps(SECTION, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert manifest["recipe_section_sha256"] == expected
    assert not any((tmp_path / "work").iterdir())  # the scratch folder goes once the output is committed


def test_a_missing_output_is_built_again(run, tmp_path):
    build = Builds()
    asset = _asset(build)
    _, first = run(asset)
    store = LocalStore(tmp_path / "store")
    store.delete(f"{first['prefix']}/{MANIFEST}")  # the commit marker gone: the output does not count
    _, second = run(asset)
    assert build.calls == 2
    assert second["version_key"] == first["version_key"] and second["data_version"] == first["data_version"]


def test_the_version_key_follows_the_fingerprints(run):
    build = Builds()
    sizes = iter(["input.txt:10", "input.txt:11"])
    asset = _asset(build, prepare=lambda inputs: inputs.but(fingerprints=[next(sizes)]))
    assert run(asset)[1]["version_key"] != run(asset)[1]["version_key"]
    assert build.calls == 2


def test_a_missing_upstream_output_fails_the_step_naming_the_command(run):
    build = Builds()
    with pytest.raises(StepFailed, match="Failure: .*pretrain materialize --select test/upstream"):
        run(_asset(build, reads={"documents": AssetKey(["test", "upstream"])}))
    assert build.calls == 0


def test_output_not_found_from_a_hook_fails_the_step_the_same_way(run):
    def prepare(inputs):
        raise OutputNotFound("test/other has never been materialized")

    with pytest.raises(StepFailed, match="Failure: test/other has never been materialized"):
        run(_asset(Builds(), prepare=prepare))


def test_a_build_that_raises_commits_nothing_and_keeps_its_scratch(run, tmp_path):
    with pytest.raises(StepFailed, match="RuntimeError: engine broke"):
        run(_asset(Builds(fail=RuntimeError("engine broke"))))
    assert LocalStore(tmp_path / "store").list("test/") == []
    [kept] = (tmp_path / "work").iterdir()  # left for inspection
    assert (kept / "out" / "part-00000.txt").exists()


def test_declared_failures_become_a_step_failure_with_their_message(run, tmp_path):
    with pytest.raises(StepFailed, match="Failure: bad input: no documents"):
        run(_asset(Builds(fail=ValueError("bad input: no documents")), failures=(ValueError,)))
    assert LocalStore(tmp_path / "store").list("test/") == []


def test_checks_run_on_a_reused_output_too(run):
    seen = []

    def checks(inputs, output):
        seen.append(output.prefix)
        return [AssetCheckResult(check_name="fine", passed=True)]

    asset = _asset(Builds(), checks=checks, check_specs=[AssetCheckSpec("fine", asset=KEY)])
    for result, _ in (run(asset), run(asset)):
        assert [e.passed for e in result.get_asset_check_evaluations()] == [True]
    assert len(seen) == 2 and seen[0] == seen[1]


def test_a_resumable_build_that_fails_continues_in_the_same_folder_which_goes_once_committed(run, tmp_path):
    folders = []

    def build(inputs: Inputs, out_dir):
        folders.append(inputs.work)
        done = inputs.work / "done-before-the-kill"
        if not done.exists():  # the first attempt leaves work behind and dies
            done.touch()
            raise RuntimeError("killed half-way")
        (out_dir / "part-00000.txt").write_text("finished")
        return {"counts": {"kept": 1}}

    asset = _asset(build, resumable=True)
    with pytest.raises(StepFailed, match="killed half-way"):
        run(asset)
    _, result = run(asset)
    assert folders[0] == folders[1] == tmp_path / "work" / "resume" / "test" / "thing" / result["version_key"]
    assert not folders[0].exists()  # removed once the output is committed
