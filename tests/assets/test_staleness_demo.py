"""`pretrain` on the demo recipe with its trained tokenizer, materialized once: a reader setting of `math` that
changes no document reruns that raw asset alone; a changed filter on `web` reruns web's chain, the dedup stage, the
sweep, training and evaluation, while the tokenizer and every other source's outputs keep their data versions;
`--refresh` then trains a new tokenizer on the sources' current outputs, kept from then on. `where` and `docs` read
what was made.

One long test on purpose: materializing the demo takes the time (minutes), the checks after it are cheap. It took in
what two smaller tests checked on two sources (the tokenizer kept until --refresh, test_staleness_tokenizer; a
changed filter threshold through training, test_training): the same paths, run once, on every source of the demo.
Three of them read less than the demo does (`smaller_corpus`): what reruns does not depend on how much they hold."""

import copy
import json
from pathlib import Path

import pytest
from dagster import AssetKey, AssetSelection, DagsterInstance

from assets.cli import main
from assets.definitions import build_defs
from assets.recipe import load_recipe
from tests.assets.test_cli import materialization_counts, set_math_min_chars, shorter_training, status_rows, write_demo_copy
from tests.pipelines.ingest.test_step import gzip_members

DATA_VERSION_TAG = "dagster/data_version"
WEB_PAGES = 250  # of the crawl's 1,171: its filters' drops, kept pages and near-duplicates all still occur
MATH_PROBLEMS = 1500  # of GSM8K's 7,473: all of them took 40 s to filter, the longest data step after the crawl's


def smaller_corpus(raw, web_warc: Path, math_jsonl: Path):
    """`web` reads the first WEB_PAGES pages of its crawl (all of it took 53 s to extract and 64 s to filter, on the
    critical path twice), `books` tinyshakespeare alone (the 95 plays of the archive took 48 s to filter), `math` the
    first MATH_PROBLEMS problems."""
    sources = {source["name"]: source for source in raw["sources"]}
    sources["web"]["inputs"] = [str(web_warc)]
    sources["books"]["inputs"] = ["books/tinyshakespeare.txt"]
    sources["math"]["inputs"] = [str(math_jsonl)]


def first_lines(source: Path, dest: Path, count: int) -> Path:
    """`dest` holding the first `count` lines of `source`, as they are (a JSON-lines head: the first documents)."""
    with open(source) as lines:
        dest.write_text("".join(line for _, line in zip(range(count), lines)))
    return dest


def cheaper(raw, web_warc: Path, math_jsonl: Path):
    """smaller_corpus, shorter_training, no zero-shot evaluation during training, evaluations of the losses without
    lm-evaluation-harness, a reference model of a quarter of the steps, four benchmarks to decontaminate against, and
    main -> anneal without the long-context stage (a third training and evaluation, run twice, that reruns as the
    anneal does): what reruns is the question here, not how well the models learn. The long-context stage and
    lm-eval on each stage are tests/assets/training/test_training.py's: lm-eval's start and the checkpoint's export
    to Hugging Face format took 8-9 s of each of this test's four evaluations, whatever its task and item count."""
    smaller_corpus(raw, web_warc, math_jsonl)
    shorter_training(raw)
    raw["training"]["long_context"] = []
    raw["mixing"]["candidates"] = 2  # a sweep of two proxy runs reruns as a sweep of four would
    raw["training"]["main"].setdefault("metrics", {})["downstream_interval"] = 0
    raw["evaluation"]["tasks"] = []
    raw["reference"]["train_tokens"] = 32 * 16 * 64  # 32 steps, not the demo's 128 (curation/reference_lm's test)
    # web's ablation (two more proxy runs, one more after the filter change) is tests/assets/curation/test_ablation.py's.
    raw.pop("ablation")
    # Four of the demo's 17 benchmarks (LAMBADA's, and those of math, code and an n-gram-rich one): the
    # index of all 17 holds 5.4M n-grams and took ~24 s to build; every source is still decontaminated against it.
    raw["decontamination"]["benchmarks"] = ["benchmarks/lambada_openai_test.jsonl", "benchmarks/gsm8k_test.jsonl",
                                            "benchmarks/HumanEval.jsonl.gz", "benchmarks/arc_easy_test.jsonl"]


def stricter_web_filter(raw):
    [web] = [s for s in raw["sources"] if s["name"] == "web"]
    web["filter"] = copy.deepcopy(web["filter"])  # the demo's YAML shares it with cc and cc_wet (an anchor)
    web["filter"]["gopher_quality"]["max_non_alpha_words_ratio"] = 0.5


def data_versions() -> dict[str, str]:
    """{asset (or asset[partition]): the data version of its latest materialization}."""
    instance = DagsterInstance.get()
    versions = {}
    for key in instance.get_asset_keys():
        for record in instance.fetch_materializations(key, limit=500).records:  # newest first
            event = record.asset_materialization
            name = key.to_user_string() + (f"[{event.partition}]" if event.partition else "")
            versions.setdefault(name, event.tags[DATA_VERSION_TAG])
    return versions


def committed_manifest(capsys, key: str) -> dict:
    capsys.readouterr()
    assert main(["where", key]) == 0
    return json.loads(capsys.readouterr().out.split("\n", 1)[1])


def tokenizer_manifest(capsys) -> dict:
    return committed_manifest(capsys, "tokenization/tokenizer")


@pytest.mark.slow  # the whole demo (shorter training), then web's chain through training again
@pytest.mark.timeout(3600)  # 16 min for the first pass alone on 2 busy shared cores
def test_the_demo_reruns_exactly_what_a_change_touches_and_keeps_the_tokenizer(tmp_path, monkeypatch, capsys,
                                                                             shared_data):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    recipe = tmp_path / "recipe.yaml"
    web_warc = tmp_path / "web-pages-head.warc.gz"  # the first pages' gzip members, as they are
    web_warc.write_bytes(b"".join(gzip_members(shared_data / "crawl/web-pages.warc.gz", WEB_PAGES)))
    math_jsonl = first_lines(shared_data / "math/gsm8k_train.jsonl", tmp_path / "gsm8k-head.jsonl", MATH_PROBLEMS)
    write_demo_copy(recipe, lambda raw: cheaper(raw, web_warc, math_jsonl))
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe))
    missing = status_rows(capsys)
    assert missing and all(state == "missing" for state, _ in missing.values())
    assert main(["materialize"]) == 0
    fresh = status_rows(capsys)
    assert set(fresh) == set(missing) and all(state == "fresh" for state, _ in fresh.values()), fresh
    trained = tokenizer_manifest(capsys)
    assert trained["code_version"].startswith("tokenizer:kept:")
    # Each training asset says where its TensorBoard events are and how to open them (written while it trained).
    for stage in ("main", "anneal"):
        event = DagsterInstance.get().get_latest_materialization_event(AssetKey(["training", stage]))
        meta = {k: v.value for k, v in event.asset_materialization.metadata.items()}
        assert meta["tensorboard_command"] == f"tensorboard --logdir {meta['tensorboard_logdir']}"
        assert list(Path(meta["tensorboard_logdir"]).glob("events.out.tfevents.*")), meta["tensorboard_logdir"]
    # Main records the target loss the mixture fit predicted beside the one it reached (the demo's target: the
    # mean of its validation losses), the proxy's scale named, as the ladder's prediction is recorded.
    event = DagsterInstance.get().get_latest_materialization_event(AssetKey(["training", "main"]))
    meta = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    weights_event = DagsterInstance.get().get_latest_materialization_event(AssetKey(["mixing", "mixture_weights"]))
    fit = {k: v.value for k, v in weights_event.asset_materialization.metadata.items()}
    assert meta["mixture_predicted_target_loss"] == fit["predicted_target_loss"]
    assert meta["target_loss"] == sum(meta["val_loss"].values()) / len(meta["val_loss"])
    assert meta["target_loss_below_prediction"] == meta["mixture_predicted_target_loss"] - meta["target_loss"]
    assert meta["mixture_prediction_for"].startswith("the proxy: ") and meta["mixture_fit"] == fit["prefix"]

    # A reader setting of one source changes: that source's raw asset alone turns stale and reruns. Every GSM8K
    # problem is longer than 20 characters, so its documents, and so its data version, stay as they were.
    write_demo_copy(recipe, lambda raw: (cheaper(raw, web_warc, math_jsonl), set_math_min_chars(raw, 20)))
    changed = status_rows(capsys)
    stale = {key: cause for key, (state, cause) in changed.items() if state != "fresh"}
    assert list(stale) == ["curation/math/raw_crawl"] and "code version" in stale["curation/math/raw_crawl"]
    counts_before = materialization_counts(changed)
    assert main(["materialize", "--stale"]) == 0
    counts_after = materialization_counts(changed)
    assert {key for key in changed if counts_after[key] != counts_before[key]} == {"curation/math/raw_crawl"}
    assert counts_after["curation/math/raw_crawl"] == counts_before["curation/math/raw_crawl"] + 1
    assert all(state == "fresh" for state, _ in status_rows(capsys).values())
    assert main(["materialize", "--stale"]) == 0  # nothing stale: it does nothing
    assert materialization_counts(changed) == counts_after

    # where: URI first, then the manifest of the new version; docs: real documents, with their source.
    capsys.readouterr()
    assert main(["where", "curation/math/raw_crawl"]) == 0
    uri, manifest_text = capsys.readouterr().out.split("\n", 1)
    manifest = json.loads(manifest_text)
    assert uri.startswith("file://") and uri.endswith(manifest["version_key"])
    assert manifest["asset"] == "curation/math/raw_crawl" and manifest["counts"]["kept"] == MATH_PROBLEMS
    assert manifest["data_version"]
    assert main(["docs", "raw_crawl", "--source", "math", "--limit", "3"]) == 0
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(docs) == 3 and all(doc["metadata"]["source"] == "math" and doc["text"] for doc in docs)

    # A stricter filter on web.
    before = data_versions()
    untouched = [f"curation/{s.name}/decontaminated" for s in load_recipe(recipe).sources if s.name != "web"]
    runs_before = {key: committed_manifest(capsys, key)["run_id"] for key in untouched}
    write_demo_copy(recipe, lambda raw: (cheaper(raw, web_warc, math_jsonl), set_math_min_chars(raw, 20),
                                               stricter_web_filter(raw)))
    # Dagster shows staleness one step at a time: the filtered asset whose section changed.
    assert {k for k, (state, _) in status_rows(capsys).items() if state != "fresh"} == {"curation/web/filtered"}
    assert main(["materialize", "--stale"]) == 0
    after = data_versions()
    assert all(state == "fresh" for state, _ in status_rows(capsys).values())

    graph = build_defs(load_recipe(recipe)).resolve_asset_graph()
    downstream = {k.to_user_string() for k in
                  AssetSelection.assets(AssetKey(["curation", "web", "filtered"])).downstream().resolve(graph)}
    others = {f"{stage}/{s.name}/{name}" for s in load_recipe(recipe).sources if s.name != "web"
              for stage, name in (("curation", "decontaminated"), ("tokenization", "packed"))}
    expected = downstream - others - {"tokenization/tokenizer"}
    assert {"curation/deduplicated", "curation/web/decontaminated", "tokenization/web/packed", "mixing/mix_sweep",
            "mixing/mixture_weights", "training/main", "evaluation/main"} <= expected
    changed = {name for name in after if before.get(name) != after[name]}
    assert {name.split("[")[0] for name in changed} == expected
    # Every proxy run of the sweep trained on the new web shards.
    assert {name for name in before if name.startswith("mixing/mix_sweep[")} <= changed
    # The tokenizer was reused, not trained again: same data version, the output its first run committed.
    assert after["tokenization/tokenizer"] == before["tokenization/tokenizer"]
    assert tokenizer_manifest(capsys)["run_id"] == trained["run_id"]
    assert {name for name in others if after[name] != before[name]} == set()
    # Dagster saw the other sources' decontaminated outputs as stale (the dedup output they read changed), but their
    # slices of it did not: each committed output was found and reused (the run that made it), not recomputed.
    assert {key: committed_manifest(capsys, key)["run_id"] for key in untouched} == runs_before

    # --refresh: a new tokenizer, sampled from the sources' current outputs (web's are new), so packing goes stale.
    assert main(["materialize", "--select", "tokenization/tokenizer", "--refresh"]) == 0
    refreshed = tokenizer_manifest(capsys)
    assert refreshed["run_id"] != trained["run_id"]
    assert refreshed["upstream"]["curation/web/decontaminated"] == after["curation/web/decontaminated"]
    assert refreshed["upstream"]["curation/web/decontaminated"] != trained["upstream"]["curation/web/decontaminated"]
    rows = status_rows(capsys)
    assert rows["tokenization/tokenizer"][0] == "fresh"
    assert all(rows[f"tokenization/{s.name}/packed"][0] == "stale" for s in load_recipe(recipe).sources)
    # Without --refresh, the refreshed tokenizer is the kept one from now on.
    assert main(["materialize", "--select", "tokenization/tokenizer"]) == 0
    assert tokenizer_manifest(capsys)["run_id"] == refreshed["run_id"]
