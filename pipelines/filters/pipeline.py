"""Filtering: one source's documents -> the documents worth training on, every drop counted by reason.

    steps = filter_pipeline(FilterConfig(language=LanguageConfig(languages=("en", "de"))),
                            input_dir=Path("raw/web"), output_dir=Path("out/web"), lists_root=Path("recipes"))
    LocalRunner().run(steps, logging_dir=Path("logs"), tasks=1)   # pipelines/runner.py
    counts = filter_counts(Path("logs"))   # {"in", "kept", "dropped": {reason: n}, "flagged", "pii": {type: n}}

writes, per input file raw/web/<part>.jsonl.gz, out/web/<part>.jsonl.gz (kept documents, PII replaced by typed
placeholders such as <EMAIL>) and out/web/rejected-<step>-<part>.jsonl.gz (each dropped document with
metadata.filter_reason): named after the input, so any number of tasks writes the same files.

The steps are datatrove's where they fit (URL, language), configured from the recipe; Gopher's, C4's and FineWeb's
rules are datatrove's too, with its verdicts, made several times faster (pipelines/filters/gopher.py and fineweb.py
on the words found once and shared, words.py; pipelines/filters/c4.py); plus small steps of our own: malformed URLs,
language-aware stop words, C4's line rules writing the kept text back as it was, code quality (code.py), the quality
model, offensive language (toxicity.py), perplexity under a reference model (perplexity.py) and PII scrubbing
(pii.py). Each step has its own module (sample.py, url.py, language.py, ...), but for QualityModelFilter, here: the
classifier's module (quality.py) is read with the recipe, before datatrove may be imported, and the folder holds
its 15 modules. Order: cheap and decisive first (URL, language), then the prose or code rules, then the models, and
PII last so it only scrubs documents that are kept.

Language matters: Gopher's stop-word rule is English (it drops most German pages), so stop words come from a
per-language table and a document whose language has no list skips that one rule, never the others.
"""

from __future__ import annotations

from pathlib import Path

from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.filters.base_filter import BaseFilter

from pipelines.filters.config import FilterConfig, QualityModelConfig
from pipelines.filters.c4 import C4LineFilter
from pipelines.filters.code import CodeQualityFilter
from pipelines.filters.fineweb import FineWebQuality
from pipelines.filters.gopher import GopherRepetition, LanguageAwareGopherQuality
from pipelines.filters.language import LanguageIdFilter
from pipelines.filters.perplexity import PerplexityFilter
from pipelines.filters.pii import PiiScrubber
from pipelines.filters.quality import QualityScorer
from pipelines.filters.sample import SampleFilter
from pipelines.filters.toxicity import ToxicityFilter
from pipelines.filters.url import UrlBlocklistFilter
from pipelines.runner import stat_totals
from pipelines.input_shards import InputShardReader, InputShardWriter

class QualityModelFilter(BaseFilter):
    """Keeps documents the quality classifier scores >= threshold; metadata gets `quality_score`."""

    name = "🎯 Quality model"

    def __init__(self, config: QualityModelConfig, model_path: Path, exclusion_writer=None):
        super().__init__(exclusion_writer)
        self.threshold = config.threshold
        self.languages = frozenset(config.languages)
        self.model_path = str(model_path)
        self._scorer: QualityScorer | None = None

    def filter(self, doc: Document):
        if doc.metadata.get("language", "en") not in self.languages:
            return True
        if self._scorer is None:  # loaded in the task's process, not pickled across
            self._scorer = QualityScorer(self.model_path)
        score = self._scorer.score(doc.text)
        doc.metadata["quality_score"] = round(score, 4)
        return True if score >= self.threshold else (False, "quality_model")


def datatrove_counterpart(step: PipelineStep) -> PipelineStep | None:
    """datatrove's own step that `step` reimplements (Gopher repetition and quality, C4, FineWeb), with the same
    settings (the attributes datatrove's __init__ sets, copied from ours); None for any other step. What the verdict
    test (tests/pipelines/filters/test_gopher.py) and bench/filters.py run beside ours. Our Gopher quality step adds a
    stop-word rule per language after datatrove's rules: the counterpart has datatrove's rules only."""
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )

    kinds = ((C4LineFilter, C4QualityFilter), (GopherRepetitionFilter, GopherRepetitionFilter),
             (GopherQualityFilter, GopherQualityFilter), (FineWebQualityFilter, FineWebQualityFilter))
    for ours, theirs in kinds:
        if isinstance(step, ours):
            twin = theirs()
            break
    else:
        return None
    for name in vars(twin):
        if name in vars(step) and not name.startswith("_") and name not in ("stats", "exclusion_writer"):
            setattr(twin, name, getattr(step, name))
    return twin


# ---------------------------------------------------------------------------------------------------------------
# The pipeline


def filter_steps(config: FilterConfig, *, lists_root: Path, model_path: Path | None = None,
                 reference_dir: Path | None = None, rejected_dir: Path | None = None) -> list[PipelineStep]:
    """The filter and scrub steps for one source, in order (no reader or writer). model_path: the quality
    classifier's model; reference_dir: the reference LM's folder (pipelines/filters/perplexity.py)."""

    def rejected(step: str):
        if rejected_dir is None:
            return None
        return InputShardWriter(str(rejected_dir), prefix=f"rejected-{step}-")

    steps: list[PipelineStep] = []
    if config.sample:  # first: what it drops costs no other step anything
        steps.append(SampleFilter(config.sample, exclusion_writer=rejected("sample")))
    if config.url:
        steps.append(UrlBlocklistFilter(config.url, lists_root, exclusion_writer=rejected("url")))
    if config.language:
        steps.append(LanguageIdFilter(config.language, exclusion_writer=rejected("language")))
    if config.gopher_repetition:
        c = config.gopher_repetition
        steps.append(GopherRepetition(
            dup_line_frac=c.dup_line_frac, dup_para_frac=c.dup_para_frac, dup_line_char_frac=c.dup_line_char_frac,
            dup_para_char_frac=c.dup_para_char_frac, exclusion_writer=rejected("gopher_repetition")))
    if config.gopher_quality:
        steps.append(LanguageAwareGopherQuality(config.gopher_quality, exclusion_writer=rejected("gopher_quality")))
    if config.c4:
        steps.append(C4LineFilter(config.c4, exclusion_writer=rejected("c4")))
    if config.fineweb:
        c = config.fineweb
        steps.append(FineWebQuality(
            line_punct_thr=c.line_punct_thr, short_line_thr=c.short_line_thr, short_line_length=c.short_line_length,
            char_duplicates_ratio=c.char_duplicates_ratio, new_line_ratio=c.new_line_ratio,
            exclusion_writer=rejected("fineweb")))
    if config.code:
        steps.append(CodeQualityFilter(config.code, exclusion_writer=rejected("code")))
    if config.quality_model:
        if model_path is None:
            raise ValueError("filter.quality_model is set but no quality classifier model was given")
        steps.append(QualityModelFilter(config.quality_model, model_path, exclusion_writer=rejected("quality_model")))
    if config.toxicity:
        steps.append(ToxicityFilter(config.toxicity, exclusion_writer=rejected("toxicity")))
    if config.perplexity:
        if reference_dir is None:
            raise ValueError("filter.perplexity is set but no reference model was given")
        steps.append(PerplexityFilter(config.perplexity, reference_dir, exclusion_writer=rejected("perplexity")))
    if config.pii:
        steps.append(PiiScrubber(config.pii))
    return steps


def filter_pipeline(config: FilterConfig, *, input_dir: Path | str, output_dir: Path, lists_root: Path,
                    model_path: Path | None = None, reference_dir: Path | None = None) -> list[PipelineStep]:
    """Reader of input_dir/part-*.jsonl.gz (a folder, or a URL such as a store output's s3://...) ->
    filter_steps -> writer of output_dir/<the same names>; dropped documents go to output_dir/rejected-<step>-<input name>."""
    reader = InputShardReader(str(input_dir), glob_pattern="part-*.jsonl.gz")
    writer = InputShardWriter(str(output_dir))
    steps = filter_steps(config, lists_root=lists_root, model_path=model_path, reference_dir=reference_dir,
                         rejected_dir=output_dir)
    return [reader, *steps, writer]


def filter_counts(logging_dir: Path) -> dict:
    """{"in", "kept", "dropped": {reason: n}, "flagged": {reason: n}, "pii": {type: n}, "scrubbed_documents"} from
    a run's stats.json: documents read and written by the reader and writer, drops from every filter's
    `dropped_<reason>` stats (all our steps give one), kept documents counted apart from `flagged_<reason>` (the
    code filter's python_newer_syntax), PII from the scrubber's."""
    stats_path = Path(logging_dir) / "stats.json"
    totals = stat_totals(stats_path)
    return {
        "in": int(stat_totals(stats_path, step=InputShardReader.name)["documents"]),
        "kept": int(stat_totals(stats_path, step=InputShardWriter.name)["total"]),
        "dropped": {key[len("dropped_"):]: int(n) for key, n in totals.items() if key.startswith("dropped_")},
        "flagged": {key[len("flagged_"):]: int(n) for key, n in totals.items() if key.startswith("flagged_")},
        "pii": {key[len("pii_"):]: int(n) for key, n in totals.items() if key.startswith("pii_")},
        "scrubbed_documents": int(totals["documents_scrubbed"]),
    }
