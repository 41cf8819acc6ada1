"""One curated home a session for the tests that train on two small sources (fixtures: tests/assets/conftest.py).

The training stages' tests and the sweep's read the same curation: the demo's `c4` and `math` without filters, one
benchmark to decontaminate against and a 1,024-token tokenizer (`two_small_sources`). Curating it took each of them
~30 s, five times a suite. `curated_template` materializes it once, in a home of its own; `curated_home` copies that
home (the store, the SQLite Dagster instance and the work folders) into the test's own PRETRAIN_HOME, so a test
changes only its copy. The copy is fresh under a test's recipe as long as the recipe's curation is this one: the
store's prefixes and the recipe's paths (absolute, to ../shared/data) mean the same from any home.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from assets.recipe import DEMO_RECIPE

def two_small_sources() -> dict:
    """The demo recipe as a dict (base_dir absolute, so a copy may be written anywhere) with the curation that
    `curated_template` holds: c4 and math unfiltered (the curation chain is tested elsewhere; here it only feeds
    training), GSM8K's test set as the benchmark, a 1,024-token tokenizer, no quality classifier or reference model."""
    raw = yaml.safe_load(DEMO_RECIPE.read_text())
    raw["base_dir"] = str((DEMO_RECIPE.parent / raw["base_dir"]).resolve())
    sources = {s["name"]: s for s in raw["sources"]}
    for name in ("c4", "math"):
        sources[name].pop("filter", None)
    raw["sources"] = [sources["c4"], sources["math"]]
    raw["decontamination"]["benchmarks"] = ["benchmarks/gsm8k_test.jsonl"]
    raw["tokenizer"] = {"vocab_size": 1024, "sample_bytes": 400000}
    raw.pop("quality_classifier", None)
    raw.pop("reference", None)  # no source here scores perplexity: without it, no reference model in the graph
    raw.pop("ablation", None)  # it judges web's filter (tests/assets/curation/test_ablation.py judges others)
    return raw


@pytest.fixture(scope="session")
def curated_template(tmp_path_factory) -> Path:
    """A PRETRAIN_HOME with the two sources curated, tokenized and packed; never handed to a test itself."""
    root = tmp_path_factory.mktemp("curated-c4-math")
    raw = two_small_sources()
    for section in ("mixing", "training", "evaluation"):  # they name the demo's other sources; not curation
        raw.pop(section, None)
    recipe = root / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    home = root / "pretrain-home"
    materialize_in(home, recipe, "+tokenization/c4/packed,+tokenization/math/packed")
    return home


def materialize_in(home: Path, recipe: Path, select: str) -> None:
    """`pretrain materialize --select SELECT` of `recipe` in PRETRAIN_HOME `home`, for a fixture broader than a test."""
    from assets.cli import main

    with pytest.MonkeyPatch.context() as env:
        env.setenv("PRETRAIN_HOME", str(home))
        env.setenv("DAGSTER_HOME", str(home / "dagster"))
        env.setenv("PRETRAIN_RECIPE", str(recipe))
        assert main(["materialize", "--select", select]) == 0


@pytest.fixture
def curated_home(curated_template, pretrain_home) -> Path:
    """The test's PRETRAIN_HOME, holding a copy of the curated template."""
    copy_curated(curated_template, pretrain_home)
    return pretrain_home


def copy_curated(template: Path, home: Path) -> None:
    shutil.copytree(template, home, symlinks=True, dirs_exist_ok=True)
