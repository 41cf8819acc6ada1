"""curation/<source>/ablation, materialized for real: proxy runs through the launcher on a source of real text with a
planted junk half.

- Junk: the curated arm's loss on the reference texts (the inaugural addresses) is lower than the raw arm's, beyond
  the spread of 3 seeds.
- Null: a filter step that drops a random 30% of documents is "within noise" against the arm without it.
- Staleness: a changed threshold of one source makes that source's ablation stale and no other's; the rerun trains
  only the arm whose documents changed (launches counted from the instance's run logs), the raw arm is reused.

The real half is the C4 and Dolma documents of ../shared/data/jsonl; the junk half is made of the same text with its
words shuffled, navigation boilerplate, and lines repeated."""

from __future__ import annotations

import copy
import gzip
import json
import random
import shutil
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey, DagsterInstance, MarkdownMetadataValue

from assets.cli import main
from assets.curation.ablation import ablation_key
from assets.recipe import DEMO_RECIPE
from tests.assets.test_cli import status_rows
from tests.assets.test_plots import decoded
from tests.conftest import SHARED_DATA

pytestmark = pytest.mark.slow

NAV = ["Home", "About us", "Contact", "Login", "Sign up", "Shop", "Cart", "Blog", "Careers", "Privacy policy",
       "Terms of use", "Sitemap", "Help", "FAQ", "Newsletter", "Follow us", "Share", "Next page", "Previous"]
# 128 steps of a small model, its learning rate decayed to 0 at the end: at 16 steps the models had learned little
# beyond word frequencies (which shuffled words share), and a constant rate left the last steps' noise in each loss
# (seeds of one arm 0.6 apart). 16 warmup steps: after 4, the spike guard stopped a run (grad norms 8x their average).
TOKENS = 262144
PROXY = {"model": {"n_layers": 1, "d_model": 64}, "optim": {"lr": 2.0e-3},
         "batch": {"seq_len": 64, "global_batch": 32, "micro_batch": 32, "ramp_start": None},
         "schedule": {"kind": "wsd", "warmup_tokens": 32768, "decay_fraction": 0.5, "min_lr_ratio": 0.0}}
BOILERPLATE = ["Click here to subscribe to our newsletter and never miss an update.",
               "All rights reserved. Reproduction without permission is prohibited.",
               "This website uses cookies to improve your experience. Accept cookies to continue.",
               "Free shipping on all orders over fifty dollars. Shop now and save big!"]


def real_documents() -> list[dict]:
    """The C4 and Dolma documents, and the web pages DCLM's annotators judged good (~1.3M characters)."""
    docs = []
    for path in sorted((SHARED_DATA / "jsonl").glob("*.gz")):
        with gzip.open(path, "rt") as lines:
            docs += [{"text": json.loads(line)["text"]} for line in lines if line.strip()]
    for name in ("dclm_agreement_data.jsonl", "dclm_majority_data.jsonl"):
        with open(SHARED_DATA / "quality" / name) as lines:
            docs += [{"text": d["text"]} for d in map(json.loads, lines) if d["label"] == 1]
    return [d for d in docs if len(d["text"].split()) >= 50]


def junk_documents(real: list[dict], seed: int = 0) -> list[dict]:
    """As many junk documents as real ones, about as long: shuffled words, navigation menus, repeated lines."""
    rng = random.Random(seed)
    junk = []
    for i, doc in enumerate(real):
        words = doc["text"].split()
        if i % 3 == 0:  # the document's own words in random order, in lines of 12
            rng.shuffle(words)
            text = "\n".join(" ".join(words[k:k + 12]) for k in range(0, len(words), 12))
        elif i % 3 == 1:  # menus and footers
            text = "\n".join(" | ".join(rng.sample(NAV, 5)) for _ in range(max(8, len(words) // 10)))
        else:  # a site's boilerplate line, over and over
            line = rng.choice(BOILERPLATE)
            text = "\n".join([line] * max(8, len(words) // len(line.split())))
        junk.append({"text": text})
    return junk


def math_source(folder: Path) -> dict:
    """The demo's `math` source on the first 800 of GSM8K's 7,473 problems: the same rules, a fifth of the time."""
    demo = yaml.safe_load(DEMO_RECIPE.read_text())
    math = next(s for s in demo["sources"] if s["name"] == "math")
    problems = folder / "gsm8k-head.jsonl"
    with open(SHARED_DATA / "math" / "gsm8k_train.jsonl") as lines:
        problems.write_text("".join(line for _, line in zip(range(800), lines)))
    math["inputs"] = [str(problems)]
    return math


def junk_recipe(folder: Path) -> dict:
    """`junky` (real documents interleaved with as many junk ones, ~2.6M characters), filtered by repetition, C4's and
    FineWeb's line rules and a 70% sample, and `math`; an ablation of junky, 3 seeds, the sample step left out."""
    real = real_documents()
    docs = [d for pair in zip(real, junk_documents(real)) for d in pair]
    inputs = folder / "junky.jsonl.gz"
    with gzip.open(inputs, "wt") as out:
        out.writelines(json.dumps({"id": f"doc-{i}", **d}) + "\n" for i, d in enumerate(docs))
    demo = yaml.safe_load(DEMO_RECIPE.read_text())
    main_stage = copy.deepcopy(demo["training"]["main"])
    main_stage["model"]["vocab_size"] = 1024
    main_stage.pop("launch", None)
    return {
        "name": "junk",
        "base_dir": str((DEMO_RECIPE.parent / demo["base_dir"]).resolve()),
        "sources": [{"name": "junky", "format": "jsonl", "inputs": [str(inputs)],
                     "filter": {"sample": {"rate": 0.7, "seed": 1}, "gopher_repetition": {}, "c4": {},
                                "fineweb": {}, "pii": {}}},
                    # A second source, so that the staleness test can change one of two (the tokenizer is trained on
                    # both from the start: a new source would train a new one, and every arm would run again).
                    math_source(folder)],
        "reference": {"train_files": ["misc/state_union.zip"], "val_files": ["misc/inaugural.zip"]},
        "decontamination": {"benchmarks": ["benchmarks/gsm8k_test.jsonl"]},
        "tokenizer": {"vocab_size": 1024, "sample_bytes": 400000},
        "training": {"main": main_stage},
        "ablation": {"sources": ["junky"], "tokens": TOKENS, "repeats": 3, "leave_one_out": ["sample"],
                     "proxy": PROXY, "tasks": ["arc_easy"], "limit": 20, "eval_batches": 32},
    }


def use(monkeypatch, home: Path, recipe: dict) -> Path:
    path = home.parent / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    monkeypatch.setenv("PRETRAIN_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
    monkeypatch.setenv("PRETRAIN_RECIPE", str(path))
    return path


def ablation_metadata(home: Path, source: str) -> dict:
    instance = DagsterInstance.from_config(str(home / "dagster"))
    event = instance.get_latest_materialization_event(ablation_key(source))
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


@pytest.fixture(scope="module")
def junk_home(tmp_path_factory) -> Path:
    """A home where `junky`'s ablation is materialized (with everything it reads)."""
    folder = tmp_path_factory.mktemp("ablation-junk")
    home = folder / "pretrain-home"
    with pytest.MonkeyPatch.context() as env:
        use(env, home, junk_recipe(folder))
        env.delenv("PRETRAIN_STORE", raising=False)
        assert main(["materialize", "--select", "+curation/junky/ablation"]) == 0
    return home


def test_junk_half_curated_arm_is_better_beyond_the_spread_of_3_seeds(junk_home):
    figures = ablation_metadata(junk_home, "junky")["arm_figures"]
    raw, curated = figures["raw"], figures["curated"]
    assert raw["seeds"] == curated["seeds"] == 3 and raw["tokens"] == curated["tokens"] >= TOKENS
    # Fewer documents: the junk went (and the 30% sample).
    assert curated["documents"] < 0.5 * raw["documents"]
    spread = max(raw["spread"], curated["spread"])
    assert curated["reference_loss"] < raw["reference_loss"] - spread, figures
    assert curated["verdict"] == "better" and curated["difference"] < 0
    # Each run was scored on the reference text and the zero-shot task.
    assert set(curated["val_loss"]) == {"reference_inaugural"} and set(curated["zero_shot"]) == {"arc_easy"}
    # ... and by the bits per byte of the task's correct answers, with a verdict of its own that names its metric.
    for arm in (raw, curated):
        assert set(arm["answer_bpb_per_task"]) == {"arc_easy"} and 0 < arm["answer_bpb_per_task"]["arc_easy"] < 20
        assert len(arm["metrics"]["answer_bpb"]["values"]) == 3
    bpb = curated["by"]["answer_bpb"]
    assert bpb["metric"] == "answer bits per byte" and bpb["verdict"] in ("better", "worse", "within noise")
    assert bpb["difference"] == pytest.approx(curated["metrics"]["answer_bpb"]["mean"]
                                              - raw["metrics"]["answer_bpb"]["mean"], abs=1e-4)
    verdict = ablation_metadata(junk_home, "junky")["verdict_text"].splitlines()[0]
    assert verdict.startswith("curated: better by reference loss (") and f"{bpb['verdict']} by answer bits per byte (" in verdict
    assert curated["data"]["curation/junky/filtered"] and raw["data"]["curation/junky/raw_crawl"]
    # The plot the UI shows: a PNG that decodes, of the configured size.
    plot = decoded(MarkdownMetadataValue(ablation_metadata(junk_home, "junky")["loss_plot"]))
    assert plot.format == "PNG" and plot.size == (512, 256)


def test_a_random_30_percent_drop_is_within_noise_against_the_arm_without_it(junk_home):
    meta = ablation_metadata(junk_home, "junky")
    step = meta["step_verdicts"]["sample"]
    assert step["verdict"] == "within noise", meta["arm_figures"]
    assert abs(step["difference"]) <= step["noise"]
    assert meta["arm_figures"]["without_sample"]["documents"] > meta["arm_figures"]["curated"]["documents"]


def launches(instance: DagsterInstance, run_ids) -> int:
    """Trainer launches the runs logged (the launcher logs one line per launch)."""
    return sum(1 for run_id in run_ids for entry in instance.all_logs(run_id)
               if "launching the trainer" in (entry.user_message or ""))


def test_changed_threshold_makes_only_its_sources_ablation_stale_and_reuses_the_raw_arm(junk_home, tmp_path, monkeypatch,
                                                                                         capsys):
    home = tmp_path / "pretrain-home"
    shutil.copytree(junk_home, home, symlinks=True)
    recipe = yaml.safe_load((junk_home.parent / "recipe.yaml").read_text())  # its inputs, where they are
    math = recipe["sources"][1]
    recipe["ablation"].update({"sources": ["junky", "math"], "repeats": 1, "leave_one_out": False})
    use(monkeypatch, home, recipe)
    assert main(["materialize", "--select", "+curation/junky/ablation,+curation/math/ablation"]) == 0
    instance = DagsterInstance.from_config(str(home / "dagster"))
    before = {s: ablation_metadata(home, s)["version_key"] for s in ("junky", "math")}
    assert ablation_metadata(home, "junky")["runs_trained"] == 0  # seed 0 of both arms came from the 3-seed ablation

    # About the shortest sixth of these problems (their 20th percentile is 64 words): the kept set changes. At 30 none
    # went, and the curated arm was rightly reused (its packed tokens, the run's input, were the same).
    math["filter"]["gopher_quality"]["min_doc_words"] = 60
    use(monkeypatch, home, recipe)
    runs_before = {r.run_id for r in instance.get_runs()}
    # The changed filter's chain first: after it, exactly math's ablation is stale among the ablations.
    assert main(["materialize", "--select", "+tokenization/tokenizer"]) == 0
    rows = status_rows(capsys)
    assert rows["curation/math/ablation"][0] == "stale" and rows["curation/junky/ablation"][0] == "fresh", rows
    assert main(["materialize", "--stale", "--select", "+curation/junky/ablation,+curation/math/ablation"]) == 0
    after = {s: ablation_metadata(home, s)["version_key"] for s in ("junky", "math")}
    assert after["junky"] == before["junky"] and after["math"] != before["math"]
    new_runs = {r.run_id for r in instance.get_runs()} - runs_before
    assert launches(instance, new_runs) == 1  # the curated arm of math: its raw arm is reused
    meta = ablation_metadata(home, "math")
    assert meta["runs_trained"] == 1 and meta["runs_reused"] == 1
    capsys.readouterr()
    assert main(["status"]) == 0
    verdicts = [line.split(None, 2) for line in capsys.readouterr().out.splitlines() if "  verdict  " in line]
    assert [(key, text.split(" (")[0]) for key, _, text in verdicts] == [
        ("curation/junky/ablation", "curated: spread not measured by reference loss"),
        ("curation/math/ablation", "curated: spread not measured by reference loss")]


@pytest.mark.parametrize("module, before, after", [
    # how a reference text is cut into paragraphs, and read
    ("pipelines/filters/perplexity.py", "min_words: int = 4", "min_words: int = 5"),
    ("pipelines/filters/perplexity.py", 'if not n.endswith("/")', 'if not n.endswith(("/", "\\\\"))'),
    # how it is packed
    ("assets/curation/ablation.py", "PackingConfig(val_fraction=0.0)", "PackingConfig(val_fraction=0.0, seed=1)"),
    ("pipelines/tokenization/tokenizer.py", "def pack_documents(", "def pack_documents(  "),
])
def test_a_packed_reference_texts_key_covers_the_code_that_makes_it(tmp_path, module, before, after):
    """The ablation reuses a reference text packed by an earlier build when its key matches: a change of any code
    that makes it must change the key (REFERENCE_CODE), or a stale pack is reused."""
    from assets.core.source_hash import code_digest
    from assets.curation.ablation import REFERENCE_CODE
    from tests.conftest import REPO

    same, edited = tmp_path / "same", tmp_path / "edited"  # two roots: digests are cached per root
    for root in (same, edited):
        for package in ("assets", "pipelines"):
            shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    path = edited / module
    text = path.read_text()
    assert text.count(before) == 1, before
    path.write_text(text.replace(before, after))
    assert code_digest(REFERENCE_CODE, same) == code_digest(REFERENCE_CODE, REPO)
    assert code_digest(REFERENCE_CODE, edited) != code_digest(REFERENCE_CODE, REPO)
