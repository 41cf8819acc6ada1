"""Filter settings: one kw-only dataclass per filter step (pipelines/filters/), composed into FilterConfig, and
the recipe's `reference` section (ReferenceConfig: the text of the model the perplexity step scores with), and the
code each setting turns on (STEP_CODE: what a filtered output's code version hashes).

Kept apart from the steps so that reading a recipe (assets/recipe/) and loading the code location do not import
datatrove: every `pretrain` command validates the recipe first, and the UI and the daemon load the code location
again and again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Gopher-style stop words: the most frequent function words of each language (Gopher's English list is
# datatrove's STOP_WORDS). A document needs `min_stop_words` distinct ones; German pages have "der die und".
DEFAULT_STOP_WORDS: dict[str, tuple[str, ...]] = {
    "en": ("the", "be", "to", "of", "and", "that", "have", "with"),
    "de": ("der", "die", "das", "und", "ist", "zu", "den", "mit", "nicht", "von"),
    "fr": ("le", "la", "les", "de", "et", "est", "un", "une", "des", "que"),
    "es": ("el", "la", "de", "que", "y", "en", "los", "se", "las", "por"),
    "pl": ("i", "w", "na", "z", "nie", "się", "do", "to", "że", "jest"),
    "pt": ("o", "a", "de", "que", "e", "do", "da", "em", "um", "para"),
    "it": ("il", "di", "che", "e", "la", "un", "per", "non", "una", "sono"),
    "nl": ("de", "het", "een", "en", "van", "is", "dat", "op", "te", "in"),
}


# ---------------------------------------------------------------------------------------------------------------
# Configs: one kw-only dataclass per step; a recipe's `sources[].filter` section (None = the step is off)


@dataclass(frozen=True, kw_only=True)
class UrlFilterConfig:
    """Blocklists are plain text files (one entry a line, # comments), relative to the recipe's folder."""

    blocked_domains_files: tuple[str, ...] = ()  # registered domains or full host names
    blocked_words_files: tuple[str, ...] = ()  # a URL containing one of these words (split on non-alphanumerics)
    blocked_subwords_files: tuple[str, ...] = ()  # ... or one of these substrings of its normalized form
    drop_missing_url: bool = False  # False: documents without a URL (books, code) pass untouched


@dataclass(frozen=True, kw_only=True)
class LanguageConfig:
    languages: tuple[str, ...]  # ISO 639-1 codes as lid.176 predicts them ("en", "de", ...)
    min_score: float = 0.65  # a listed language must score above this

    def __post_init__(self):
        if not self.languages:
            raise ValueError("language.languages must list at least one language code")
        if not 0.0 <= self.min_score < 1.0:
            raise ValueError(f"language.min_score must be within [0, 1), got {self.min_score}")


@dataclass(frozen=True, kw_only=True)
class GopherQualityConfig:
    min_doc_words: int | None = 50
    max_doc_words: int | None = 100_000
    min_avg_word_length: int | None = 3
    max_avg_word_length: int | None = 10
    max_symbol_word_ratio: float | None = 0.1
    max_bullet_lines_ratio: float | None = 0.9
    max_ellipsis_lines_ratio: float | None = 0.3
    max_non_alpha_words_ratio: float | None = 0.8
    min_stop_words: int | None = 2
    # Per language; None = DEFAULT_STOP_WORDS. A language missing here skips the stop-word rule.
    stop_words: dict[str, tuple[str, ...]] | None = None


@dataclass(frozen=True, kw_only=True)
class GopherRepetitionConfig:
    dup_line_frac: float | None = 0.3
    dup_para_frac: float | None = 0.3
    dup_line_char_frac: float | None = 0.2
    dup_para_char_frac: float | None = 0.2


@dataclass(frozen=True, kw_only=True)
class C4Config:
    """C4's rules (pipelines/filters/c4.py): lines are dropped, the rest of the text stays as it was."""

    filter_no_terminal_punct: bool = True  # drops lines, not documents
    min_num_sentences: int = 5  # -1 disables
    min_words_per_line: int = 3  # -1 disables
    max_word_length: int = 1000
    filter_lorem_ipsum: bool = True
    filter_javascript: bool = True
    filter_curly_bracket: bool = True
    filter_policy: bool = True
    remove_citations: bool = True  # "[1]", "[edit]", "[citation needed]" are cut out of kept lines
    # Keep a line of fewer than min_words_per_line words when it starts with a letter or digit and the next
    # non-blank line is a kept sentence line: a heading (pipelines/filters/c4.py). C4 drops them all.
    keep_headings: bool = False


@dataclass(frozen=True, kw_only=True)
class FineWebConfig:
    line_punct_thr: float = 0.12
    short_line_thr: float = 0.67
    short_line_length: int = 30
    char_duplicates_ratio: float = 0.01
    new_line_ratio: float = 0.3


@dataclass(frozen=True, kw_only=True)
class CodeConfig:
    """Heuristics for source code (prose rules would drop every file for lack of stop words and sentences)."""

    max_line_length: int = 1000  # minified or data blobs
    max_mean_line_length: float = 100.0
    min_alnum_fraction: float = 0.25  # of all characters
    # Phrases of generator headers. Not a bare "generated by": Project Euler docstrings say "numbers are
    # generated by adding ..." (4 real files of the demo were dropped by it).
    autogenerated_markers: tuple[str, ...] = (
        "auto-generated", "autogenerated", "automatically generated", "code generated by", "do not edit",
        "this file was generated", "this file is generated", "generated by the protocol buffer compiler",
        "@generated",
    )
    marker_lines: int = 5  # markers are looked for in the first lines only (a header comment)
    # Python files (name .py/.pyi, or metadata language: python) must parse; one that 3.11's ast rejects only for
    # newer syntax (PEP 695 generics, 3.12 f-strings, 3.14 `except A, B:`) is counted apart and kept unless
    # keep_newer_syntax is off (pipelines/filters/code.py).
    python_syntax: bool = True
    keep_newer_syntax: bool = True
    license_lines: int = 30  # SPDX ids, licence texts and copyright lines are looked for in these first lines
    # SPDX ids (case-insensitive) a file's licence must be one of; "none" admits files without one. None: any.
    allowed_licenses: tuple[str, ...] | None = None
    min_stars: int | None = None  # metadata `stars` / `max_stars_count`, where the input has it
    # Drop files whose repository (metadata repository / repo_name) has no test file in the same task's input.
    require_tests_in_repo: bool = False


@dataclass(frozen=True, kw_only=True)
class QualityModelConfig:
    """Keep documents the `quality_classifier` scores at least `threshold` (probability of high quality)."""

    threshold: float = 0.5
    languages: tuple[str, ...] = ("en",)  # the model knows these; other documents pass unscored

    def __post_init__(self):
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"quality_model.threshold must be within [0, 1], got {self.threshold}")


@dataclass(frozen=True, kw_only=True)
class SampleConfig:
    """Keep a seeded `rate` of the documents, chosen by a hash of their id: the same documents whatever the task
    count or the run. A subsample for a smaller run, and the control of an ablation (a step that drops documents at
    random should make no difference beyond noise: assets/curation/ablation.py)."""

    rate: float
    seed: int = 0

    def __post_init__(self):
        if not 0.0 < self.rate <= 1.0:
            raise ValueError(f"sample.rate must be within (0, 1], got {self.rate}")


@dataclass(frozen=True, kw_only=True)
class PiiConfig:
    """Which PII kinds pipelines/filters/pii.py replaces, by group; each placeholder is <KIND>."""

    email: bool = True  # EMAIL
    ip: bool = True  # IPV4 (not after "version", "v", ...), IPV6
    phone: bool = True  # PHONE
    credentials: bool = True  # AWS_ACCESS_KEY, PRIVATE_KEY blocks, SECRET (the value of secret=... assignments)
    tokens: bool = True  # JWT, GITHUB_TOKEN, SLACK_TOKEN, GOOGLE_API_KEY, STRIPE_KEY
    card: bool = True  # CARD_NUMBER: payment card numbers passing Luhn
    iban: bool = True  # IBAN: with valid mod-97 check digits
    ssn: bool = True  # SSN: US social security numbers of valid areas, groups and serials


@dataclass(frozen=True, kw_only=True)
class ToxicityConfig:
    """Offensive language (pipelines/filters/toxicity.py): sentences scored by alt-profanity-check's model.

    Defaults measured on real text: all 1,647 wikitext-2 validation paragraphs of 20+ words keep 99.9% (the two
    dropped quote musicians swearing), the demo's 363 English crawl pages 99.4% (two pages that swear go).
    """

    sentence_threshold: float = 0.9  # a sentence scoring at or above this counts as offensive
    max_share: float = 0.2  # drop (toxicity_share) when more than this share of the judged sentences is offensive
    max_score: float | None = 0.999  # drop (toxicity_max) when any sentence scores at or above this; None = off
    min_sentence_words: int = 3  # shorter fragments (menu items, headings) are not judged
    languages: tuple[str, ...] = ("en",)  # the model knows English; other documents pass unscored

    def __post_init__(self):
        for name in ("sentence_threshold", "max_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"toxicity.{name} must be within [0, 1], got {getattr(self, name)}")
        if self.max_score is not None and not 0.0 < self.max_score <= 1.0:
            raise ValueError(f"toxicity.max_score must be within (0, 1] or null, got {self.max_score}")
        if self.min_sentence_words < 1:
            raise ValueError(f"toxicity.min_sentence_words must be at least 1, got {self.min_sentence_words}")
        if not self.languages:
            raise ValueError("toxicity.languages must list at least one language code")


@dataclass(frozen=True, kw_only=True)
class PerplexityConfig:
    """Perplexity under the recipe's reference model (pipelines/filters/perplexity.py; the `reference` section trains
    it as curation/reference_lm). Keep a document when its perplexity is at most `max_perplexity`, and/or when it lies
    within `keep_percentiles` [lo, hi] of the perplexities the reference model gives its own validation paragraphs
    (a band fixed by the model, so the kept documents never depend on the task count or the order)."""

    max_perplexity: float | None = None
    keep_percentiles: tuple[float, float] | None = None
    languages: tuple[str, ...] = ("en",)  # the reference text's language; other documents pass unscored
    max_tokens: int = 512  # a document's first tokens are scored: the cost per document is bounded

    def __post_init__(self):
        if self.max_perplexity is None and self.keep_percentiles is None:
            raise ValueError("perplexity needs max_perplexity or keep_percentiles")
        if self.max_perplexity is not None and self.max_perplexity <= 1.0:
            raise ValueError(f"perplexity.max_perplexity must be above 1, got {self.max_perplexity}")
        if self.keep_percentiles is not None:
            lo, hi = self.keep_percentiles
            if not 0.0 <= lo < hi <= 100.0:
                raise ValueError(f"perplexity.keep_percentiles must be [lo, hi] with 0 <= lo < hi <= 100, "
                                 f"got {list(self.keep_percentiles)}")
        if self.max_tokens < 2:
            raise ValueError(f"perplexity.max_tokens must be at least 2, got {self.max_tokens}")
        if not self.languages:
            raise ValueError("perplexity.languages must list at least one language code")


@dataclass(frozen=True, kw_only=True)
class ReferenceConfig:
    """The recipe's `reference` section: the text curation/reference_lm trains a small causal LM on (our trainer),
    with a byte-level BPE of its own trained on the same text. Files are relative to the recipe's base_dir; a .zip
    is read as the text of all its members. Sized to train in seconds on 2 CPU cores."""

    train_files: tuple[str, ...]
    val_files: tuple[str, ...]
    vocab_size: int = 2048
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    seq_len: int = 64
    train_tokens: int = 131_072  # 128 steps of 16 sequences of 64 tokens
    global_batch: int = 16
    lr: float = 3e-3
    max_train_bytes: int = 1_500_000  # of the train files' paragraphs, in order: bounds the tokenizer's training
    max_val_bytes: int = 100_000  # of the val files' paragraphs, in order: the validation figures cost seconds
    seed: int = 0

    def __post_init__(self):
        if not self.train_files or not self.val_files:
            raise ValueError("reference.train_files and reference.val_files must each name at least one file")


@dataclass(frozen=True, kw_only=True)
class FilterConfig:
    """A source's filter settings (recipe: `sources[].filter`). Steps left out (None) do not run."""

    sample: SampleConfig | None = None
    url: UrlFilterConfig | None = None
    language: LanguageConfig | None = None
    gopher_repetition: GopherRepetitionConfig | None = None
    gopher_quality: GopherQualityConfig | None = None
    c4: C4Config | None = None
    fineweb: FineWebConfig | None = None
    code: CodeConfig | None = None
    quality_model: QualityModelConfig | None = None
    toxicity: ToxicityConfig | None = None
    perplexity: PerplexityConfig | None = None  # needs the recipe's `reference` section
    pii: PiiConfig | None = field(default_factory=PiiConfig)
    # No task count here: how many tasks run is the executor's (PRETRAIN_EXECUTOR_TASKS; by default one per input
    # part), and it never changes which documents are kept, so it is no part of the version.

    def list_files(self) -> list[str]:
        """Every blocklist file the settings name (their contents are part of the version)."""
        if self.url is None:
            return []
        return [*self.url.blocked_domains_files, *self.url.blocked_words_files, *self.url.blocked_subwords_files]


# A misspelt or retired setting in a recipe's filter section is refused by name when pydantic reads it (the
# recipe does), not silently ignored: pydantic takes a stdlib dataclass's settings from __pydantic_config__.
for _settings in (UrlFilterConfig, LanguageConfig, GopherQualityConfig, GopherRepetitionConfig, C4Config,
                  FineWebConfig, CodeConfig, QualityModelConfig, ToxicityConfig, PerplexityConfig, ReferenceConfig,
                  SampleConfig, PiiConfig,
                  FilterConfig):
    _settings.__pydantic_config__ = {"extra": "forbid"}


# The code each step runs, by its setting (a FilterConfig field): modules under pipelines/ whose every top-level
# definition ("filters.url:*") a filtered output's version hashes, or one definition ("filters.config:Name"), so that
# editing a step's module makes stale exactly the sources whose filter uses it (assets/curation/filtered.py; a
# module's imports and docstring are no part of it, assets/core/source_hash.py). A step's module holds its rules
# and their private helpers; Gopher's two rule sets share gopher.py (one paper), so an edit there makes stale the
# sources of either. The quality model's step (QualityModelFilter) is in pipeline.py, which every source hashes;
# its scorer is quality.py. Here, not beside the steps: the code location names them at load, and they import
# datatrove.
_WORDS = "filters.words:*"  # the shared words (split_words, view): every step that decides on words
STEP_CODE: dict[str, tuple[str, ...]] = {
    "sample": ("filters.sample:*",),
    "url": ("filters.url:*",),
    "language": ("filters.language:*",),
    "gopher_repetition": ("filters.gopher:*", _WORDS),
    "gopher_quality": ("filters.gopher:*", _WORDS, "filters.config:DEFAULT_STOP_WORDS"),
    "c4": ("filters.c4:*",),
    "fineweb": ("filters.fineweb:*", _WORDS),
    "code": ("filters.code:*",),
    "quality_model": ("filters.quality:*",),
    "toxicity": ("filters.toxicity:*",),
    "perplexity": ("filters.perplexity:*",),
    "pii": ("filters.pii:*",),
}
# What every source's filtering runs, whatever its steps: the steps' assembly, reader and writer.
PIPELINE_CODE = ("filters.pipeline:*",)
