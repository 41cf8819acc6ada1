"""assets/evaluation/stage.py: one evaluation per training stage of the demo recipe (key, reads, deps, section),
and the `python -m trainer.evaluate` command its build hands the launcher, found with a launcher that records it."""

from pathlib import Path

from dagster import AssetKey, DagsterInstance

import assets.evaluation.stage as evaluation
from assets.core.factory import Inputs
from assets.core.versioning import code_version
from assets.recipe import DEMO_RECIPE, load_recipe
from storage.local import LocalStore
from tests.assets.training.test_inputs import committed, context_for, packed

SOURCES = ["web", "cc", "cc_wet", "c4", "books", "code", "math"]


def specs_of(monkeypatch, recipe):
    monkeypatch.setattr(evaluation, "output_asset", lambda spec: spec)
    return evaluation.evaluation_assets(recipe)


def test_demo_specs(monkeypatch):
    recipe = load_recipe(DEMO_RECIPE)
    specs = specs_of(monkeypatch, recipe)
    assert [s.key for s in specs] == [AssetKey(["evaluation", n]) for n in ("main", "long_512", "anneal")]
    for spec, name in zip(specs, ("main", "long_512", "anneal")):
        assert spec.group == "evaluation" and spec.stage == f"evaluation-{name}"
        assert dict(spec.reads) == {"trained": AssetKey(["training", name])}
        # Every source's held-out split, whatever the stage trained on.
        assert list(spec.deps) == [AssetKey(["tokenization", s, "packed"]) for s in SOURCES] + [
            AssetKey(["tokenization", "tokenizer"])]
        assert spec.section == recipe.evaluation.model_dump(mode="json")
        assert spec.code_version == code_version(f"evaluation-{name}", spec.code_sha256, spec.section)
        assert spec.resources == frozenset({"launcher"})
    assert specs[0].section["tasks"] == ["lambada", "hellaswag", "arc_easy", "piqa"] and specs[0].section["limit"] == 50


class RecordingLauncher:
    def __init__(self):
        self.calls = []

    def run_python(self, context, args, work):
        self.calls.append((args, work))


def test_prepare_and_the_evaluate_command(monkeypatch, tmp_path):
    recipe = load_recipe(DEMO_RECIPE)
    spec = specs_of(monkeypatch, recipe)[1]  # long_512
    instance = DagsterInstance.ephemeral()
    store = LocalStore(tmp_path / "store")
    outs, tok = packed(instance, store, tmp_path, SOURCES)
    checkpoint = {"prefix": "checkpoints/long_512/k/step-00000004", "uri": "x", "step": 4}
    (tmp_path / "store" / checkpoint["prefix"]).mkdir(parents=True)
    trained = committed(instance, store, tmp_path, AssetKey(["training", "long_512"]), {"summary.json": "{}"},
                        {"checkpoint": checkpoint})
    launcher = RecordingLauncher()
    context = context_for(instance, tmp_path, launcher=launcher)
    inputs = spec.prepare(Inputs(context=context, store=store, outputs={"trained": trained}))
    assert inputs.upstream == {**{f"tokenization/{s}/packed": outs[s].data_version for s in SOURCES},
                               "tokenization/tokenizer": tok.data_version, "training/long_512": trained.data_version}
    assert inputs.manifest == {"checkpoint": checkpoint}

    work = tmp_path / "eval"
    (work / "out").mkdir(parents=True)
    assert spec.build(inputs.but(work=work), work / "out") == {}
    [(args, ran_in)] = launcher.calls
    assert ran_in == work

    def value(flag):
        return args[args.index(flag) + 1]

    assert args[:2] == ["-m", "trainer.evaluate"]
    assert value("--checkpoint") == str(tmp_path / "store" / checkpoint["prefix"])  # a local store: in place
    assert Path(value("--tokenizer")).read_text() == "{}" and value("--tokenizer").endswith("tokenizer.json")
    assert value("--benchmarks") == str(recipe.input_root / recipe.evaluation.benchmarks)
    assert value("--tasks") == "lambada,hellaswag,arc_easy,piqa" and value("--limit") == "50"
    assert value("--val-sequences") == str(recipe.evaluation.val_sequences)
    assert value("--out") == str(work / "out" / "results.json")
    assert [args[i + 1] for i, a in enumerate(args) if a == "--val"] == [
        f"{s}={tmp_path / 'store' / outs[s].prefix}" for s in SOURCES]
    assert ("--canary" in args) == bool(recipe.evaluation.canary)
    instance.dispose()
