"""Recipes fail at load, before anything runs, with the file and the field named."""

import pytest
import yaml

from assets.recipe import DEMO_RECIPE, RecipeError, load_recipe


def write_recipe(tmp_path, mutate) -> str:
    """A copy of the demo recipe, changed by `mutate`, with base_dir made absolute."""
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    raw["base_dir"] = str((DEMO_RECIPE.parent / raw["base_dir"]).resolve())
    mutate(raw)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def test_demo_recipe_loads_and_names_real_inputs(shared_data):
    recipe = load_recipe(DEMO_RECIPE)
    names = [source.name for source in recipe.sources]
    assert {"web", "c4", "books", "code", "math"} <= set(names)
    for source in recipe.sources:
        files = recipe.input_files(source)
        assert files and all(shared_data in f.parents for f in files), source.name


def test_pretrain_recipe_env_chooses_the_recipe(tmp_path, monkeypatch):
    path = write_recipe(tmp_path, lambda raw: raw.update(name="chosen-by-env"))
    monkeypatch.setenv("PRETRAIN_RECIPE", path)
    assert load_recipe().name == "chosen-by-env"


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda raw: raw.update(colour="blue"), "colour: Extra inputs are not permitted"),
        (lambda raw: raw["sources"][0].update(formt="warc"), "sources[0] (web).formt: Extra inputs are not permitted"),
        (lambda raw: raw["sources"][1]["reader"].update(min_text_chars="many") if "reader" in raw["sources"][1] else raw["sources"][1].update(reader={"min_text_chars": "many"}),
         "sources[1] (cc).reader.min_text_chars: Input should be a valid integer"),
        (lambda raw: raw["sources"][0].setdefault("reader", {}).update(bogus=1), "sources[0] (web).reader.bogus"),
        (lambda raw: raw["sources"][2].update(format="pdf"), "sources[2] (cc_wet).format: Input should be"),
        (lambda raw: raw["sources"][3].update(inputs=["jsonl/no-such-file-*.jsonl.gz"]), "sources[3] (c4).inputs: "),
        (lambda raw: raw["sources"].append(dict(raw["sources"][0])), "source name 'web' is used twice"),
        (lambda raw: raw["sources"][0].update(name="Web Pages"), "sources[0] (Web Pages).name"),
        # Deduplicated in name order, so a list in another order is refused rather than taken in an order it hides.
        (lambda raw: raw["sources"][3].update(inputs=["jsonl/{dump}/*.jsonl.gz"], dumps=["dump2", "dump10"]),
         "sources[3] (c4).dumps: Value error, 'dump10' is listed after 'dump2' but sorts before it"),
    ],
    ids=["unknown-top-key", "unknown-source-key", "wrong-type", "unknown-reader-key", "bad-format", "missing-input", "duplicate-name", "bad-name",
         "dumps-out-of-order"],
)
def test_bad_recipe_names_the_file_and_the_field(tmp_path, mutate, expected):
    path = write_recipe(tmp_path, mutate)
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    message = str(caught.value)
    assert path in message
    assert expected in message


def without_cc(raw):
    """The demo without its `cc` source, which the quality classifier's negatives name."""
    raw["sources"] = [s for s in raw["sources"] if s["name"] != "cc"]


def many_sources(raw):
    """1,000 copies of the demo's c4 source (c4_0 ... c4_999), and a prior that names one that is not there."""
    c4 = next(s for s in raw["sources"] if s["name"] == "c4")
    raw["sources"] = [{**c4, "name": f"c4_{i}"} for i in range(1000)]
    raw.pop("quality_classifier")
    raw["mixing"]["prior"] = {"c4_0": 0.5, "wiki": 0.5}
    raw.pop("training")


@pytest.mark.parametrize(
    "mutate, field, missing",
    [
        (without_cc, "quality_classifier.negative_sources", "cc"),
        (lambda raw: raw["mixing"]["prior"].update(wiki=0.1), "mixing.prior", "wiki"),
        (lambda raw: raw["training"]["anneal"]["weights"].update(wiki=1.0), "training.anneal.weights", "wiki"),
        (lambda raw: raw["training"]["long_context"][0].update(weights={"wiki": 1.0}),
         "training.long_context[0] (long_512).weights", "wiki"),
        (lambda raw: raw["ablation"].update(sources=["web", "wiki"]), "ablation.sources", "wiki"),
    ],
    ids=["quality-negatives", "mixing-prior", "anneal-weights", "long-context-weights", "ablation-sources"],
)
def test_a_field_that_names_a_missing_source_is_a_recipe_error_naming_the_field(tmp_path, capsys, mutate, field,
                                                                                 missing):
    from assets.cli import main

    path = write_recipe(tmp_path, mutate)
    assert main(["status", "--recipe", path]) == 2  # a validation error, not a traceback
    err = capsys.readouterr().err
    assert path in err and f"{field} names a source the recipe does not have: {missing}" in err, err
    assert "its sources are web" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda raw: raw.pop("reference") and [s["filter"].pop("perplexity", None) for s in raw["sources"]],
         "ablation: the arms are scored on reference.val_files"),
        (lambda raw: raw.pop("training") and raw.pop("mixing"), "ablation: the arms train the proxy model"),
        (lambda raw: raw["ablation"].update(leave_one_out=["quality_modle"]),
         "ablation.leave_one_out: 'quality_modle' is not a filter step; the steps are sample, url, language"),
        (lambda raw: raw["ablation"].update(sweep={"setting": "quality_model.treshold", "values": [0.4]}),
         "ablation.sweep.setting: quality_model has no setting 'treshold'; it has threshold, languages"),
        (lambda raw: raw["ablation"].update(sweep={"setting": "code.max_line_length", "values": [100]}),
         "ablation.sweep.setting: no source of ablation.sources sets filter.code"),
        (lambda raw: raw["ablation"].update(sweep={"setting": "quality_model.threshold", "values": [0.4, 1.5]}),
         "ablation.sweep.values[1]: quality_model.threshold must be within [0, 1], got 1.5"),
        (lambda raw: raw["ablation"].update(sweep={"setting": "threshold", "values": [0.4]}),
         "ablation.sweep.setting: Value error, give a filter step and one of its fields"),
        (lambda raw: raw["ablation"].update(repeats=0), "ablation.repeats: Input should be greater than or equal to 1"),
    ],
    ids=["no-reference", "no-training", "leave-one-out-step", "sweep-field", "sweep-step-unused", "sweep-value",
         "sweep-setting-form", "repeats"],
)
def test_an_ablation_section_that_cannot_run_is_a_recipe_error_naming_the_field(tmp_path, capsys, mutate, expected):
    from assets.cli import main

    path = write_recipe(tmp_path, mutate)
    assert main(["status", "--recipe", path]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err


def test_the_names_offered_are_ten_then_a_count(tmp_path):
    path = write_recipe(tmp_path, many_sources)
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    message = str(caught.value)
    assert "mixing.prior names a source the recipe does not have: wiki" in message
    assert message.endswith("its sources are " + ", ".join(f"c4_{i}" for i in range(10)) + " and 990 more")


def test_missing_input_names_the_pattern(tmp_path):
    path = write_recipe(tmp_path, lambda raw: raw["sources"][3].update(inputs=["jsonl/no-such-file-*.jsonl.gz"]))
    with pytest.raises(RecipeError, match="no-such-file"):
        load_recipe(path)


def test_missing_recipe_file_and_bad_yaml(tmp_path):
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_recipe(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nsources: [\n")
    with pytest.raises(RecipeError, match=f"{broken}: not valid YAML"):
        load_recipe(broken)


@pytest.mark.parametrize("section, field", [
    ("reader", "workers"),  # ingest's parallelism is the executor's now (PRETRAIN_EXECUTOR_WORKERS)
    ("reader", "extract_htm"), ("dedup", "docs_per_shard"), ("decontamination", "docs_per_shard"),
    ("tokenizer", "vocab"), ("packing", "val_frac"), ("filter", "languge"),
])
def test_a_retired_or_misspelt_setting_is_refused_by_name_not_ignored(tmp_path, section, field):
    def mutate(raw):
        if section in ("reader", "filter"):
            raw["sources"][0].setdefault(section, {})[field] = 2
        else:
            raw.setdefault(section, {})[field] = 2
    with pytest.raises(RecipeError, match=rf"\b{section}\.{field}: Unexpected keyword argument"):
        load_recipe(write_recipe(tmp_path, mutate))


@pytest.mark.slow  # materializes the example's raw_crawl from a moto S3 server (~15 s)
def test_the_s3_crawl_example_reads_its_warcs_from_the_bucket(tmp_path, monkeypatch, capsys, s3, shared_data):
    from assets.cli import main

    example = DEMO_RECIPE.parent / "crawl_from_s3.yaml"
    recipe = load_recipe(example)  # nothing remote is listed at load
    # A real Common Crawl WARC excerpt where the example looks for the snapshot's WARCs.
    s3.client().create_bucket(Bucket="commoncrawl")
    key = "crawl-data/CC-MAIN-2024-22/segments/1715971057216.39/warc/CC-MAIN-20240517233122-00000.warc.gz"
    s3.client().upload_file(str(shared_data / "crawl" / "whirlwind_CC-MAIN-2024-22.warc.gz"), "commoncrawl", key)
    assert recipe.input_files(recipe.source("cc")) == [f"s3://commoncrawl/{key}"]
    monkeypatch.setenv("PRETRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home" / "dagster"))
    assert main(["materialize", "--recipe", str(example), "--select", "curation/cc/raw_crawl"]) == 0, \
        capsys.readouterr().err[-3000:]
    assert main(["where", "--recipe", str(example), "curation/cc/raw_crawl"]) == 0
    manifest = yaml.safe_load(capsys.readouterr().out.split("\n", 1)[1])
    assert manifest["inputs"] == [f"s3://commoncrawl/{key}"] and manifest["counts"]["kept"] >= 1


def test_the_gpu_1b_recipe_loads_and_plans_one_run_of_three_stages_that_fits_8_h100s(capsys):
    """recipes/gpu-1b.yaml: ~1.1B parameters at 4k, main -> long_16k (Ulysses over 2 GPUs) -> anneal, each stage
    continuing main's run; `pretrain plan` sizes it on 8 H100s without a warning."""
    from assets.cli import main

    example = DEMO_RECIPE.parent / "gpu-1b.yaml"
    recipe = load_recipe(example)
    configs = dict(recipe.training.run_configs())
    assert list(configs) == ["main", "long_16k", "anneal"]
    main_cfg, long_cfg = configs["main"], configs["long_16k"]
    assert (main_cfg.batch.seq_len, main_cfg.batch.global_batch * main_cfg.batch.seq_len) == (4096, 2 ** 21)
    assert (long_cfg.batch.seq_len, long_cfg.batch.sequence_parallel) == (16384, 2)
    assert long_cfg.model.activation_checkpointing == "full" and long_cfg.optim.lr == main_cfg.optim.lr / 10
    for cfg in configs.values():
        cfg.batch.check_world(8)  # every stage's batch splits over 8 ranks
    assert main(["plan", "--recipe", str(example), "--device", "h100", "--dp", "8", "--zero", "1", "--mfu", "0.45",
                 "--price", "2"]) == 0
    out, err = capsys.readouterr()
    assert "WARNING" not in out + err
    assert "parameters          1,107,363,840 (1.11 B)" in out
    # 6N + attention at 4k over 22B tokens at 45% of an H100's 989 TFLOP/s: ~108 GPU-hours, ~$216.
    blocks = out.split("\n\n")
    assert "GPU-hours           108 H100" in blocks[0] and "cost                $216" in blocks[0]
    assert "sequence parallel 2" in blocks[1] and "recompute full" in blocks[1]
