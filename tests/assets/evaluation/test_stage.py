"""assets/evaluation/stage.py: one evaluation per training stage of the demo recipe (key, reads, deps, section),
the `python -m trainer.evaluation.evaluate` command its build hands the launcher, found with a launcher that records it, and
the metadata it makes of lm-eval's results."""

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
        # The evaluations of the stages it descends from, for the plot across stages (long_512 and anneal: main).
        earlier = {} if name == "main" else {"evaluation main": AssetKey(["evaluation", "main"])}
        assert dict(spec.reads) == {"trained": AssetKey(["training", name]), **earlier}
        # Every source's held-out split, whatever the stage trained on.
        assert list(spec.deps) == [AssetKey(["tokenization", s, "packed"]) for s in SOURCES] + [
            AssetKey(["tokenization", "tokenizer"])]
        assert spec.section == recipe.evaluation.model_dump(mode="json")
        assert spec.code_version == code_version(f"evaluation-{name}", spec.code_sha256, spec.section)
        assert spec.resources == frozenset({"launcher"})
    assert specs[0].section["tasks"] == ["lambada_openai", "hellaswag", "arc_easy", "winogrande"] and specs[0].section["limit"] == 50
    assert evaluation.lineage_of(recipe, "anneal") == ["main", "anneal"]


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

    assert args[:2] == ["-m", "trainer.evaluation.evaluate"]
    assert value("--checkpoint") == str(tmp_path / "store" / checkpoint["prefix"])  # a local store: in place
    assert Path(value("--tokenizer")).read_text() == "{}" and value("--tokenizer").endswith("tokenizer.json")
    assert value("--benchmarks") == str(recipe.input_root / recipe.evaluation.benchmarks)
    assert value("--tasks") == "lambada_openai,hellaswag,arc_easy,winogrande" and value("--limit") == "50"
    # lm-eval's task files and the exported model in the build's scratch folder, the datasets cache in the scratch root.
    assert value("--work") == str(work / "lm-eval")
    assert value("--hf-cache") == str(Path(context.resources.scratch.root) / "hf-datasets")
    assert value("--val-sequences") == str(recipe.evaluation.val_sequences)
    assert value("--out") == str(work / "out" / "results.json")
    assert [args[i + 1] for i, a in enumerate(args) if a == "--val"] == [
        f"{s}={tmp_path / 'store' / outs[s].prefix}" for s in SOURCES]
    assert ("--canary" in args) == bool(recipe.evaluation.canary)
    instance.dispose()


def lm_eval_results(acc_norm: float, stderr: float) -> dict:
    return {"step": 8, "val_loss": {"web": 6.0}, "canary_loss": 6.5, "lm_eval": {
        "results": {"arc_easy": {"alias": "arc_easy", "acc,none": 0.3, "acc_stderr,none": 0.05,
                                 "acc_norm,none": acc_norm, "acc_norm_stderr,none": stderr}},
        "n-samples": {"arc_easy": {"original": 2376, "effective": 50}}, "versions": {"arc_easy": 1.0},
        "higher_is_better": {"arc_easy": {"acc": True, "acc_norm": True}}, "n-shot": {"arc_easy": 0},
        "table": "|Tasks|Version|...|", "headline": {"arc_easy": "acc_norm"}}}


def test_metadata_is_lm_evals_results_with_its_table_and_a_plot_across_stages(monkeypatch, tmp_path):
    import json

    from assets.core.upstream import Output

    recipe = load_recipe(DEMO_RECIPE)
    spec = specs_of(monkeypatch, recipe)[2]  # anneal: main -> anneal
    store = LocalStore(tmp_path / "store")
    store.put_bytes("ev/main/results.json", json.dumps(lm_eval_results(0.28, 0.06)).encode())
    store.put_bytes("ev/anneal/results.json", json.dumps(lm_eval_results(0.34, 0.07)).encode())

    def output(key, prefix, manifest=None):
        return Output(key=AssetKey.from_user_string(key), prefix=prefix, manifest=manifest or {})

    trained = output("training/anneal", "t", {"checkpoint": {"uri": "file:///store/checkpoints/anneal/k/step-8"}})
    inputs = Inputs(context=None, store=store, outputs={"trained": trained,
                                                        "evaluation main": output("evaluation/main", "ev/main")})
    meta = spec.metadata(inputs, output("evaluation/anneal", "ev/anneal"))
    assert meta["lm_eval"].value["results"]["arc_easy"]["acc_norm_stderr,none"] == 0.07
    assert meta["lm_eval_table"].value == "|Tasks|Version|...|"
    assert meta["arc_easy_acc_norm"] == 0.34 and meta["step"] == 8
    assert "data:image/png;base64," in meta["lm_eval_across_stages"].value
    assert "main -> anneal" in meta["lm_eval_across_stages"].value
