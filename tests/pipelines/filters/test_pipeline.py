"""The filter pipeline on real documents: drop reasons, languages, sampling (code: test_code.py); and each step's
code version takes in exactly the modules the step runs (pipelines/filters/config.py STEP_CODE)."""

import gzip
import json
import shutil
import zipfile
from pathlib import Path

import pytest
from datatrove.data import Document
from datatrove.pipeline.filters import GopherQualityFilter

from assets.core.source_hash import code_digest
from pipelines.runner import LocalRunner
from pipelines.filters.config import (
    PIPELINE_CODE,
    STEP_CODE,
    C4Config,
    FilterConfig,
    FineWebConfig,
    GopherQualityConfig,
    GopherRepetitionConfig,
    LanguageConfig,
    SampleConfig,
    UrlFilterConfig,
)
from pipelines.filters.gopher import LanguageAwareGopherQuality
from pipelines.filters.pipeline import filter_counts, filter_pipeline
from pipelines.ingest.step import ingest_source
from pipelines.ingest.config import ReaderConfig
from pipelines.shards import iter_documents

REPO = Path(__file__).resolve().parents[3]
LISTS = REPO / "recipes"
PROSE = FilterConfig(
    url=UrlFilterConfig(blocked_domains_files=("lists/blocked_domains.txt",), blocked_words_files=("lists/blocked_words.txt",)),
    language=LanguageConfig(languages=("en", "de")),
    gopher_repetition=GopherRepetitionConfig(),
    gopher_quality=GopherQualityConfig(),
    c4=C4Config(filter_no_terminal_punct=False),
    fineweb=FineWebConfig(),
)

EMAIL, PHONE = "jane.doe@example.org", "+1 (555) 123-4567"


def c4_documents(shared_data, n=None) -> list[dict]:
    with gzip.open(shared_data / "jsonl" / "olmo_c4-sample.01.json.gz", "rt") as f:
        rows = [json.loads(line) for line in f][:n]
    return [{"text": r["text"], "id": f"c4-{i}", "metadata": {"source": "c4", "url": r.get("url") or r["metadata"]["url"]}}
            for i, r in enumerate(rows)]


def run_filters(config: FilterConfig, docs: list[dict], tmp_path: Path, model_path=None):
    """The engine as an asset runs it: parts in, datatrove executor, parts and rejected files out."""
    inp, out, logs = tmp_path / "in", tmp_path / "out", tmp_path / "logs"
    inp.mkdir(parents=True)
    with gzip.open(inp / "part-00000.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(d) + "\n" for d in docs)
    steps = filter_pipeline(config, input_dir=inp, output_dir=out, lists_root=LISTS, model_path=model_path)
    LocalRunner().run(steps, logging_dir=logs, tasks=1)
    kept = [d for p in sorted(out.glob("part-*.jsonl.gz")) for d in iter_documents(p)]
    rejected = [d for p in sorted(out.glob("rejected-*.jsonl.gz")) for d in iter_documents(p)]
    return kept, rejected, filter_counts(logs)


def test_pipeline_keeps_clean_documents_unchanged_and_counts_every_drop(shared_data, tmp_path):
    docs = c4_documents(shared_data, 12)
    clean = docs[0]
    blocked_domain = next(line for line in (LISTS / "lists/blocked_domains.txt").read_text().splitlines() if not line.startswith("#"))
    planted = [
        {**docs[1], "id": "blocked-domain", "metadata": {**docs[1]["metadata"], "url": f"https://www.{blocked_domain}/page"}},
        {**docs[2], "id": "malformed-url", "metadata": {**docs[2]["metadata"], "url": "hard::example.com-page.html"}},
        {**docs[3], "id": "pii", "text": docs[3]["text"] + f"\nContact: {EMAIL} or {PHONE}."},
        {"text": "Bonjour tout le monde. " * 40, "id": "french", "metadata": {"source": "c4", "url": "https://example.fr/a"}},
        {**docs[4], "id": "short", "text": " ".join(docs[4]["text"].split()[:30])},
    ]
    inputs = [clean] + planted + docs[5:]
    kept, rejected, counts = run_filters(PROSE, inputs, tmp_path)

    by_id = {d["id"]: d for d in kept}
    assert by_id["c4-0"]["text"] == clean["text"]  # a clean real document passes every step unchanged
    assert by_id["c4-0"]["metadata"]["language"] == "en" and by_id["c4-0"]["metadata"]["language_score"] > 0.65
    assert EMAIL not in by_id["pii"]["text"] and "<EMAIL>" in by_id["pii"]["text"]
    assert counts["pii"] == {"EMAIL": 1, "PHONE": 1}

    reasons = {d["id"]: d["metadata"]["filter_reason"] for d in rejected}
    assert reasons["blocked-domain"] == "url_domain"
    assert reasons["malformed-url"] == "url_malformed"
    assert reasons["french"] == "language"
    assert reasons["short"] == "gopher_short_doc"
    # Every input document is kept or dropped for a counted reason, and each dropped one was written aside.
    assert counts["in"] == len(inputs) == counts["kept"] + sum(counts["dropped"].values())
    assert counts["kept"] == len(kept)
    assert sorted(counts["dropped"].items()) == sorted(_tally(reasons.values()).items())


def _tally(values) -> dict:
    out: dict = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def german_udhr(shared_data) -> str:
    with zipfile.ZipFile(shared_data / "lid" / "nltk_udhr2.zip") as z:
        return z.read("udhr2/deu.txt").decode("utf-8")


def test_german_text_is_judged_by_german_stop_words(shared_data):
    doc = Document(text=german_udhr(shared_data), id="udhr-de", metadata={"language": "de"})
    # Gopher's English rule drops real German prose for lacking "the", "and", ...
    assert GopherQualityFilter().filter(doc) == (False, "gopher_enough_stop_words")
    assert LanguageAwareGopherQuality(GopherQualityConfig()).filter(doc) is True
    # A language without a list skips only that rule; a list that does not fit the text still drops it.
    assert LanguageAwareGopherQuality(GopherQualityConfig(stop_words={"en": ("the", "and")})).filter(doc) is True
    english_only = LanguageAwareGopherQuality(GopherQualityConfig(stop_words={"de": ("the", "and", "of")}))
    assert english_only.filter(doc) == (False, "gopher_enough_stop_words")


def test_german_pages_survive_when_the_source_lists_german(shared_data, tmp_path):
    raw = tmp_path / "raw"
    ingest_source(name="cc", inputs=[shared_data / "crawl" / "resiliparse_CC-MAIN-2020-34_excerpt.warc.gz"],
                  format="warc", reader=ReaderConfig(), out_dir=raw)
    pages = [d for d in iter_documents(raw / "part-00000-00000.jsonl.gz")]
    with zipfile.ZipFile(shared_data / "lid" / "nltk_genesis.zip") as z:
        genesis = z.read("genesis/german.txt").decode("latin-1")
    german = [{"text": german_udhr(shared_data), "id": "udhr-de", "metadata": {"source": "t", "url": "https://www.ohchr.org/de"}},
              {"text": genesis[:20000], "id": "genesis-de", "metadata": {"source": "t", "url": "https://example.de/genesis"}}]
    config = FilterConfig(language=LanguageConfig(languages=("en", "de")), gopher_quality=GopherQualityConfig())
    kept, rejected, counts = run_filters(config, pages + german, tmp_path / "run")
    german_kept = {d["id"] for d in kept if d["metadata"]["language"] == "de"}
    assert {"udhr-de", "genesis-de"} <= german_kept
    assert "gopher_enough_stop_words" not in counts["dropped"]
    # Pages in languages the source does not list (this excerpt has zh, nl, es, fi) go at language ID.
    assert counts["dropped"]["language"] >= 5
    assert all(d["metadata"]["language"] in ("en", "de") for d in kept)

    # The same German documents under an English-only stop-word list: the rule STACK.md warns about.
    english_only = FilterConfig(language=config.language, gopher_quality=GopherQualityConfig(
        stop_words={"en": ("the", "be", "to", "of", "and", "that", "have", "with"),
                    "de": ("the", "be", "to", "of", "and", "that", "have", "with")}))
    kept_en, _, counts_en = run_filters(english_only, pages + german, tmp_path / "run-en")
    assert not {d["id"] for d in kept_en if d["metadata"]["language"] == "de"}
    assert counts_en["dropped"]["gopher_enough_stop_words"] == len(german_kept)


def test_sample_keeps_a_seeded_share_by_document_id_whatever_the_order(tmp_path):
    docs = [{"id": f"doc-{i}", "text": f"document number {i}"} for i in range(2000)]
    config = FilterConfig(sample=SampleConfig(rate=0.7, seed=3), pii=None)
    kept, rejected, counts = run_filters(config, docs, tmp_path / "a")
    assert counts["dropped"] == {"sample": len(rejected)} and len(kept) + len(rejected) == 2000
    assert 0.66 < len(kept) / 2000 < 0.74  # a binomial share: sd 0.01
    again, _, _ = run_filters(config, list(reversed(docs)), tmp_path / "b")
    assert {d["id"] for d in again} == {d["id"] for d in kept}  # by id, not by position
    other, _, _ = run_filters(FilterConfig(sample=SampleConfig(rate=0.7, seed=4), pii=None), docs, tmp_path / "c")
    assert {d["id"] for d in other} != {d["id"] for d in kept}
    with pytest.raises(ValueError, match="sample.rate must be within"):
        SampleConfig(rate=0.0)


@pytest.mark.parametrize("bad, message", [
    (dict(language=dict(languages=())), "at least one language"),
    (dict(tasks=4), "tasks"),  # the executor's setting now (PRETRAIN_EXECUTOR_TASKS), not the recipe's
])
def test_bad_settings_name_the_field(bad, message):
    import pydantic

    with pytest.raises(pydantic.ValidationError, match=message):
        pydantic.TypeAdapter(FilterConfig).validate_python(bad)


def test_missing_list_file_is_named(tmp_path):
    config = FilterConfig(url=UrlFilterConfig(blocked_domains_files=("lists/nope.txt",)))
    with pytest.raises(ValueError, match="nope.txt"):
        filter_pipeline(config, input_dir=tmp_path, output_dir=tmp_path / "o", lists_root=LISTS)


def test_filter_engine_imports_no_dagster_and_its_settings_no_datatrove():
    import subprocess
    import sys

    code = (
        "import sys, pipelines.filters.config, pipelines.filters.quality\n"
        "assert 'datatrove' not in sys.modules  # a recipe is read before anything heavy is imported\n"
        "import pipelines.filters.pipeline\n"
        "assert not [m for m in sys.modules if m == 'dagster' or m.startswith('dagster.')]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_filtered_parts_are_byte_reproducible(tmp_path):
    """Same documents, same bytes: a rebuilt output keeps its data version (nothing downstream turns stale)."""
    import hashlib
    import time

    from datatrove.data import Document
    from datatrove.pipeline.writers import JsonlWriter

    import pipelines.filters.pipeline  # noqa: F401  (registers the reproducible gzip)

    digests = []
    for attempt in range(2):
        out = tmp_path / f"run-{attempt}" / "nested"
        with JsonlWriter(str(out), output_filename="part-${rank}.jsonl.gz") as writer:
            writer.write(Document(text="the same text", id="a", metadata={"source": "t"}), rank=0)
        digests.append(hashlib.sha256((out / "part-00000.jsonl.gz").read_bytes()).hexdigest())
        time.sleep(1.1)  # a gzip header's mtime has one-second resolution
    assert digests[0] == digests[1]


# A line of one definition of each filter module, and an edit of it: {module: (old, new)}.
EDITS = {
    "sample": ('(False, "sample")', '(False, "sampled_out")'),
    "url": ('return False, "url_malformed"', 'return False, "url_bad"'),
    "language": ('return False, "language"', 'return False, "lang"'),
    "words": ('word = token.text.strip()', 'word = token.text.strip(" ")'),
    "gopher": ('return False, "gopher_short_doc"', 'return False, "gopher_short"'),
    "fineweb": ('return False, "list_ratio"', 'return False, "lists"'),
    "c4": ('return False, "too_few_sentences"', 'return False, "few_sentences"'),
    "code": ('return False, "code_long_line"', 'return False, "code_too_long_line"'),
    "quality": ("return self.scores([text])[0]", "return self.scores([text])[-1]"),
    "config": ('"en": ("the", "be", "to",', '"en": ("the", "a", "to",'),
    "pipeline": ('"in": int(', '"read": int('),
}
# Which steps run each module's code ("pipeline": every source's filtering, PIPELINE_CODE).
USERS = {"sample": {"sample"}, "c4": {"c4"}, "code": {"code"}, "quality": {"quality_model"},
         "config": {"gopher_quality"},  # its stop-word lists; the settings are the recipe's part of a version
         "url": {"url"}, "language": {"language"}, "fineweb": {"fineweb"},
         "words": {"gopher_repetition", "gopher_quality", "fineweb"}, "gopher": {"gopher_repetition", "gopher_quality"},
         "pipeline": {"pipeline"}}


def step_versions(root: Path) -> dict[str, str]:
    """{step: the code digest of what it names in STEP_CODE} and "pipeline": PIPELINE_CODE's, read under root."""
    refs = {step: code for step, code in STEP_CODE.items()} | {"pipeline": PIPELINE_CODE}
    return {step: code_digest([f"pipelines.{ref}" for ref in code], root) for step, code in refs.items()}


def copy_of_the_engines(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "pipelines", tmp_path / "pipelines", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


@pytest.mark.parametrize("module", sorted(USERS))
def test_editing_a_filter_module_changes_the_code_version_of_exactly_the_steps_that_use_it(module, tmp_path):
    """An edit of any definition of a step's module makes stale the filtered outputs of the sources whose filter runs
    that step and no others (assets/curation/filtered.py hashes STEP_CODE's modules of the steps a source turns on)."""
    copy = copy_of_the_engines(tmp_path)
    path = copy / "pipelines" / "filters" / f"{module}.py"
    old, new = EDITS[module]
    assert path.read_text().count(old) == 1, old
    path.write_text(path.read_text().replace(old, new))
    before, after = step_versions(REPO), step_versions(copy)
    assert {step for step in before if before[step] != after[step]} == USERS[module]


def test_a_definition_added_to_a_step_module_is_in_its_code_version(tmp_path):
    """No list of names to keep: a helper added to url.py is in the url step's version, in no other step's."""
    copy = copy_of_the_engines(tmp_path)
    path = copy / "pipelines" / "filters" / "url.py"
    path.write_text(path.read_text() + "\n\n_SCHEMES = (\"http\", \"https\")\n")
    before, after = step_versions(REPO), step_versions(copy)
    assert {step for step in before if before[step] != after[step]} == {"url"}


def test_every_filter_module_is_in_some_steps_code_version():
    """Each module of pipelines/filters/ that runs in a step is named by the steps that run it (the settings and
    the package's docstring aside)."""
    named = {ref.partition(":")[0] for code in (*STEP_CODE.values(), PIPELINE_CODE) for ref in code}
    modules = {f"filters.{p.stem}" for p in (REPO / "pipelines" / "filters").glob("*.py") if p.stem != "__init__"}
    assert modules - named == set()
    assert all(ref.endswith(":*") for code in (*STEP_CODE.values(), PIPELINE_CODE) for ref in code
               if not ref.startswith("filters.config:"))
