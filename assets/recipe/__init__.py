"""Recipes: the YAML a user edits, validated by pydantic before anything runs.

The Recipe model composes one module per section, each named for it (sources, curation, mixing, training,
evaluation, ablation, scaling: assets/recipe/<section>.py), and checks here what spans sections: a field that
names sources names the recipe's own, the reference text kept apart from the positives and the benchmarks, what an
ablation or the ladder needs from training.main.

A recipe composes the engines' own config types (a source's `reader` is `pipelines.ingest.config.ReaderConfig`),
so a field added to an engine is a recipe field at once. Every error names the file and the field:

    recipes/mine.yaml: sources[1] (web).reader.min_text_chars: Input should be a valid integer

The recipe in force is chosen by `--recipe` (CLI) or `PRETRAIN_RECIPE`, default `recipes/demo.yaml`.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import typing
from pathlib import Path

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from assets.recipe.ablation import AblationSection
from assets.recipe.curation import ChecksConfig
from assets.recipe.evaluation import EvaluationSection
from assets.recipe.mixing import MixingSection
from assets.recipe.scaling import ScalingSection, scaling_params
from assets.recipe.sources import DUMP_NAME, DUMP_PLACEHOLDER, SourceConfig  # noqa: F401  (DUMP_NAME: the dumps sensor reads it from here)
from assets.recipe.training import TrainingSection, check_stage, merge
from pipelines.decontam.config import DecontamConfig
from pipelines.dedup.config import DedupConfig
from pipelines.filters.config import FilterConfig, ReferenceConfig
from pipelines.inputs import URL_SCHEME, expand_inputs
from pipelines.filters.quality import QualityClassifierConfig
from pipelines.tokenization.config import PackingConfig, TokenizerConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
# libyaml's loader where PyYAML was built with it (the wheels are): the same documents, ~10x faster than the pure
# Python one, which took 0.05 s of each load of the code location at 100 sources and 0.5 s at 1,000.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
DEMO_RECIPE = REPO_ROOT / "recipes" / "demo.yaml"


class RecipeError(ValueError):
    """A recipe that cannot be used; the message names the file and the field."""

class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="The recipe's name, shown by `pretrain` and in the runs' tags")
    description: str = Field("", description="What the recipe is for, in a sentence")
    base_dir: str = Field(".", description="Where relative inputs are found, relative to the recipe file")
    sources: list[SourceConfig] = Field(min_length=1, description=(
        "The input corpora, each with its reader and filter; a source's name is part of its assets' keys"))
    quality_classifier: QualityClassifierConfig | None = Field(None, description=(
        "Trains curation/quality_classifier, the model a source's `quality_model` filter step scores with: "
        "positive files, negative sources and files, boilerplate sources, the labelled files it is judged on"))
    reference: ReferenceConfig | None = None  # the reference LM of the perplexity filter (curation/reference_lm)
    dedup: DedupConfig = DedupConfig()  # one global stage over all sources
    decontamination: DecontamConfig = DecontamConfig()  # benchmark paths relative to base_dir
    tokenizer: TokenizerConfig = TokenizerConfig()  # train a BPE, or adopt `path` (relative to base_dir)
    packing: PackingConfig = Field(PackingConfig(), description=(
        "How each source's documents are packed into token shards: the validation split, by document"))
    mixing: MixingSection | None = None  # the proxy-model mix sweep (assets/recipe/mixing.py)
    training: TrainingSection | None = None  # main, long-context stages, anneal (assets/recipe/training.py)
    evaluation: EvaluationSection = EvaluationSection()  # what each stage's final checkpoint is measured on
    ablation: AblationSection | None = None  # filter ablations: proxy runs on raw and curated text (assets/recipe/ablation.py)
    scaling: ScalingSection | None = None  # the scaling-law ladder and its fit (assets/recipe/scaling.py)
    checks: ChecksConfig = ChecksConfig()  # how the documents checks read outputs (not in any code version)

    # Set by load_recipe, not by the YAML: where the recipe came from, to resolve relative inputs.
    path: Path | None = Field(None, exclude=True)

    @field_validator("sources")
    @classmethod
    def _unique_names(cls, sources: list[SourceConfig]) -> list[SourceConfig]:
        seen: set[str] = set()
        for source in sources:
            if source.name in seen:
                raise ValueError(f"source name {source.name!r} is used twice")
            seen.add(source.name)
        return sources

    @field_validator("quality_classifier", "mixing", "training", "ablation")
    @classmethod
    def _names_only_its_sources(cls, section, info):
        """Every field that names sources names the recipe's own (`sources` is validated before these)."""
        for field, named in _source_references(info.field_name, section):
            _check_sources(field, named, info)
        return section

    @model_validator(mode="after")
    def _reference_text_apart(self):
        """The reference model's files: train and val apart, and neither a quality positive nor a benchmark (a model
        trained on a benchmark would keep the documents that quote it; one trained on the positives would judge by
        the same text twice). Every source's perplexity filter needs the section."""
        for source in self.sources:
            if source.filter.perplexity is not None and self.reference is None:
                raise ValueError(f"sources[{source.name}].filter.perplexity needs the recipe's `reference` section")
        if self.reference is None:
            return self
        norm = posixpath.normpath
        others = {norm(f): "quality_classifier.positive_files"
                  for f in getattr(self.quality_classifier, "positive_files", ())}
        others.update({norm(f): "decontamination.benchmarks" for f in self.decontamination.benchmarks})
        train = {norm(f) for f in self.reference.train_files}
        for field, files in (("reference.train_files", self.reference.train_files),
                             ("reference.val_files", self.reference.val_files)):
            for name in files:
                if field == "reference.val_files" and norm(name) in train:
                    raise ValueError(f"reference.val_files: {name!r} is also in reference.train_files")
                if norm(name) in others:
                    raise ValueError(f"{field}: {name!r} is also in {others[norm(name)]}")
        return self

    @model_validator(mode="after")
    def _dumps_need_the_sequential_rule(self):
        """A crawl of dumps is deduplicated dump by dump against what was kept before, which only the sequential
        rule allows (the transitive one could take a kept document back)."""
        crawls = [s.name for s in self.sources if s.has_dumps]
        if crawls and self.dedup.rule != "sequential":
            raise ValueError(f"dedup.rule: {', '.join(crawls)} {'is a crawl' if len(crawls) == 1 else 'are crawls'} of "
                             f"dumps ({DUMP_PLACEHOLDER} in the inputs), deduplicated one dump after another against "
                             f"what was kept before: set dedup.rule to sequential (it is {self.dedup.rule!r})")
        for name in (self.ablation.sources if self.ablation else []):
            if self.source(name).has_dumps:
                raise ValueError(f"ablation.sources: {name!r} is a crawl of dumps; an ablation judges an unpartitioned "
                                 "source")
        return self

    @model_validator(mode="after")
    def _ablation_has_what_it_needs(self):
        """An ablation trains proxies (training.main), scores them on reference.val_files, and names filter steps
        that exist."""
        if self.ablation is None:
            return self
        if self.training is None:
            raise ValueError("ablation: the arms train the proxy model, which is training.main with ablation.proxy "
                             "over it: give the recipe a `training` section")
        if self.reference is None or not self.reference.val_files:
            raise ValueError("ablation: the arms are scored on reference.val_files, text no filter was trained on: "
                             "give the recipe a `reference` section with val_files")
        steps = _filter_steps()
        named = self.ablation.leave_one_out if isinstance(self.ablation.leave_one_out, list) else []
        for step in named:
            if step not in steps:
                raise ValueError(f"ablation.leave_one_out: {step!r} is not a filter step; the steps are "
                                 f"{known_names(steps, limit=20)}")
        if self.ablation.sweep is not None:
            step, _, name = self.ablation.sweep.setting.partition(".")
            if step not in steps:
                raise ValueError(f"ablation.sweep.setting: {step!r} is not a filter step; the steps are "
                                 f"{known_names(steps, limit=20)}")
            fields = [f.name for f in dataclasses.fields(steps[step])]
            if name not in fields:
                raise ValueError(f"ablation.sweep.setting: {step} has no setting {name!r}; it has {known_names(fields)}")
            judged = [getattr(self.source(s).filter, step) for s in self.ablation.sources]
            if all(settings is None for settings in judged):
                raise ValueError(f"ablation.sweep.setting: no source of ablation.sources sets filter.{step}")
            for i, value in enumerate(self.ablation.sweep.values):
                for settings in (s for s in judged if s is not None):
                    try:
                        dataclasses.replace(settings, **{name: value})
                    except (TypeError, ValueError) as exc:
                        raise ValueError(f"ablation.sweep.values[{i}]: {exc}") from None
        return self

    @model_validator(mode="after")
    def _scaling_has_what_it_needs(self):
        """The ladder's rungs are training.main with scaling.proxy over it at each size: each validates as the trainer
        will validate it, and no two sizes have the same N (the fit could not tell them apart)."""
        if self.scaling is None:
            return self
        if self.training is None:
            raise ValueError("scaling: the rungs train training.main's model at each size, with scaling.proxy over it: "
                             "give the recipe a `training` section")
        base = merge(self.training.main, self.scaling.proxy)
        check_stage("scaling.proxy", base)
        seen: dict[int, int] = {}
        for i, size in enumerate(self.scaling.sizes):
            where = f"scaling.sizes[{i}] ({size.name})"
            settings = merge(base, {"model": size.model()})
            check_stage(where, settings)
            n = scaling_params(settings)
            if n in seen:
                raise ValueError(f"{where}: {n:,} parameters, as many as scaling.sizes[{seen[n]}]: "
                                 "the fit needs sizes of different N")
            seen[n] = i
        return self

    @property
    def input_root(self) -> Path:
        anchor = self.path.parent if self.path else Path.cwd()
        return (anchor / self.base_dir).resolve()

    def source(self, name: str) -> SourceConfig:
        for source in self.sources:
            if source.name == name:
                return source
        raise KeyError(f"recipe {self.name!r} has no source {name!r}; it has {known_names(s.name for s in self.sources)}")

    def input_files(self, source: SourceConfig, dump: str | None = None) -> list[Path | str]:
        """The source's inputs (one dump's, for a crawl of dumps), sorted: local files as absolute Paths, remote ones
        as URLs (str)."""
        if source.has_dumps != (dump is not None):
            raise ValueError(f"source {source.name!r}: " + ("name the dump to list" if source.has_dumps
                                                             else "has no dumps"))
        return expand_inputs(source.dump_inputs(dump) if dump is not None else source.inputs, self.input_root)


def known_names(names, limit: int = 10) -> str:
    """The names an error offers instead: the first `limit`, then how many more (a recipe may have 1,000 sources)."""
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _source_references(section_name: str, section) -> list[tuple[str, object]]:
    """[(dotted field, the source names it gives)] of one recipe section."""
    if section is None:
        return []
    if section_name == "quality_classifier":
        return [("quality_classifier.negative_sources", section.negative_sources),
                ("quality_classifier.boilerplate_sources", section.boilerplate_sources)]
    if section_name == "mixing":
        return [("mixing.prior", section.prior)]
    if section_name == "ablation":
        return [("ablation.sources", section.sources)]
    return [(f"{where}.weights", stage.weights or {}) for where, stage in section.later()]


def _check_sources(field: str, named, info) -> None:
    """A field that names sources names only the recipe's own (the error: its dotted path, what does exist)."""
    sources = [s.name for s in info.data.get("sources") or []]
    known = set(sources)
    unknown = [name for name in named if name not in known]
    if unknown:
        raise ValueError(f"{field} names {'a source' if len(unknown) == 1 else 'sources'} the recipe does not have: "
                         f"{', '.join(unknown)}; its sources are {known_names(sources)}")


def _filter_steps() -> dict[str, type]:
    """{filter step: its settings' dataclass}: FilterConfig's fields."""
    hints = typing.get_type_hints(FilterConfig)
    return {f.name: next(a for a in typing.get_args(hints[f.name]) if a is not type(None))
            for f in dataclasses.fields(FilterConfig)}


def recipe_path(explicit: str | os.PathLike | None = None) -> Path:
    """The recipe in force: the explicit one, else PRETRAIN_RECIPE, else the demo."""
    chosen = explicit or os.environ.get("PRETRAIN_RECIPE") or DEMO_RECIPE
    return Path(chosen).expanduser().resolve()


def load_recipe(path: str | os.PathLike | None = None) -> Recipe:
    """Read and validate a recipe, including that every local input exists. Raises RecipeError.

    Remote inputs (s3://...) are listed when their raw_crawl asset materializes, not here: Dagster loads the
    definitions in every run's process, and a listing of thousands of objects, or an unreachable endpoint, must
    not slow down or break loading the code location."""
    path = recipe_path(path)
    if not path.is_file():
        raise RecipeError(f"{path}: recipe file not found")
    try:
        raw = yaml.load(path.read_text(), Loader=YAML_LOADER)
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of sections, got {type(raw).__name__}")
    try:
        recipe = Recipe.model_validate({**raw, "path": path})
    except pydantic.ValidationError as exc:
        raise RecipeError(_describe(path, raw, exc)) from None
    for i, source in enumerate(recipe.sources):
        try:
            # A crawl of dumps is listed per dump, when its partitions are found or built.
            if not source.has_dumps:
                expand_inputs([spec for spec in source.inputs if not URL_SCHEME.match(spec)], recipe.input_root)
        except ValueError as exc:
            raise RecipeError(f"{path}: sources[{i}] ({source.name}).inputs: {exc}") from None
    return recipe


def _describe(path: Path, raw: dict, exc: pydantic.ValidationError) -> str:
    lines = []
    for error in exc.errors():
        lines.append(f"{path}: {_field_name(raw, error['loc'])}: {error['msg']}")
    return "\n".join(lines)


def _field_name(raw: dict, loc: tuple) -> str:
    """('sources', 1, 'reader', 'workers') -> 'sources[1] (web).reader.workers'."""
    parts: list[str] = []
    node = raw
    for item in loc:
        if isinstance(item, int):
            label = f"[{item}]"
            if isinstance(node, list) and item < len(node):
                node = node[item]
                if isinstance(node, dict) and "name" in node:
                    label += f" ({node['name']})"
            parts.append(label)
        else:
            parts.append(("." if parts else "") + str(item))
            node = node.get(item) if isinstance(node, dict) else None
    return "".join(parts) or "(top level)"
