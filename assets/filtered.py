"""Filtering assets (group "curation"): `curation/<source>/filtered` per source, and `curation/quality_classifier`.

filtered: the source's raw_crawl documents through its recipe `filter` steps (pipelines/filters.py), run by the
executor resource. Kept documents are written as part-NNNNN.jsonl.gz, PII replaced by typed placeholders;
every dropped document goes to rejected-<step>-NNNNN.jsonl.gz with metadata.filter_reason, and the manifest's
counts say how many went for each reason.

quality_classifier: a fastText model of reference text (recipe `quality_classifier.positive_files`) against
raw web documents (`negative_sources`' raw_crawl outputs, `negative_files`); its accuracy on the labelled
documents is in the materialization metadata. A source whose filter has `quality_model` reads it.
"""

import dataclasses
import gzip
import hashlib
import shutil
import time
from collections import Counter
from pathlib import Path

import pydantic
from dagster import (
    AssetExecutionContext,
    AssetKey,
    MaterializeResult,
    MetadataValue,
    asset,
)

from assets.checks import DOCUMENTS_CHECK, documents_check, documents_check_spec, read_documents
from assets.checks import validate_documents  # noqa: F401  (re-exported: tests call it by this module)
from assets.curation import raw_crawl_key
from assets.plots import bar_chart, count_table
from assets.recipe import DEMO_RECIPE, Recipe, SourceConfig
from assets.upstream import Output, committed_result, latest_output
from assets.versioning import code_version, manifest_header, version_key
from pipelines.filters import FilterConfig, filter_counts, filter_pipeline
from pipelines.ingest import iter_documents
from pipelines.quality_model import QualityClassifierConfig, read_labelled, train_quality_classifier
from resources.executor import ExecutorResource
from resources.scratch import ScratchResource
from storage.manifest import commit_folder, read_manifest
from resources.store_resource import StoreResource

# Bump when the filter or classifier code changes what it writes for the same settings.
FILTERED_IMPLEMENTATION = "v1"
CLASSIFIER_IMPLEMENTATION = "v1"
CLASSIFIER_KEY = AssetKey(["curation", "quality_classifier"])
MODEL_FILE = "model.npy"
CHECK_NAME = DOCUMENTS_CHECK


def filtered_key(source_name: str) -> AssetKey:
    return AssetKey(["curation", source_name, "filtered"])


def _list_path(recipe: Recipe, source: SourceConfig, name: str) -> Path:
    """A blocklist named in the recipe: next to the recipe file, else among those shipped in recipes/ (so a
    copy of the demo recipe elsewhere still finds lists/blocked_domains.txt)."""
    anchors = ([recipe.path.parent] if recipe.path else []) + [DEMO_RECIPE.parent]
    for anchor in anchors:
        path = (anchor / name).resolve()
        if path.is_file():
            return path
    raise ValueError(f"sources[{source.name}].filter.url: list file {name!r} not found next to the recipe "
                     f"or in {DEMO_RECIPE.parent}")


def resolved_filter(recipe: Recipe, source: SourceConfig) -> tuple[FilterConfig, dict[str, str]]:
    """The source's filter settings with absolute list paths, and {list name: sha256 of its contents}."""
    config = source.filter
    if config.url is None:
        return config, {}
    paths = {name: _list_path(recipe, source, name) for name in config.list_files()}
    url = dataclasses.replace(config.url, **{
        field: tuple(str(paths[name]) for name in getattr(config.url, field))
        for field in ("blocked_domains_files", "blocked_words_files", "blocked_subwords_files")
    })
    return dataclasses.replace(config, url=url), {name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in paths.items()}


def filtered_asset(recipe: Recipe, source: SourceConfig):
    key = filtered_key(source.name)
    uses_model = source.filter.quality_model is not None
    if uses_model and recipe.quality_classifier is None:
        raise ValueError(f"sources[{source.name}].filter.quality_model needs the recipe's quality_classifier section")
    resolved, lists = resolved_filter(recipe, source)
    # The lists' contents, not just their names: editing a blocklist makes the source's filtered asset stale.
    section = {**source.filtered_section(), "lists": lists}
    version = code_version("filtered", FILTERED_IMPLEMENTATION, section)
    upstream_keys = [raw_crawl_key(source.name)] + ([CLASSIFIER_KEY] if uses_model else [])

    @asset(
        key=key,
        deps=upstream_keys,
        group_name="curation",
        code_version=version,
        kinds={"python"},
        check_specs=[documents_check_spec(key)],
        description=(
            f"Source `{source.name}` filtered: URL blocklists, language ID, quality rules, PII scrubbing, as the "
            f"recipe's `sources[{source.name}].filter` says. Dropped documents are kept aside with their reason."
        ),
    )
    def filtered(context: AssetExecutionContext, store: StoreResource, scratch: ScratchResource,
                 executor: ExecutorResource) -> MaterializeResult:
        object_store = store.open()
        outputs = {k: latest_output(context.instance, object_store, k) for k in upstream_keys}
        upstream = {k.to_user_string(): out.data_version for k, out in outputs.items()}
        vkey = version_key(version, upstream=upstream)
        prefix = "/".join(key.path + [vkey])

        manifest = read_manifest(object_store, prefix)
        work = scratch.new_dir("/".join(key.path))
        out_dir = work / "output"
        if manifest is not None:
            context.log.info(f"{object_store.uri(prefix)} is already committed for this version; reusing it")
        else:
            inputs = outputs[raw_crawl_key(source.name)].download(object_store, work / "input")
            model_path = None
            if uses_model:
                model_path = outputs[CLASSIFIER_KEY].download(object_store, work / "model", pattern_prefix=MODEL_FILE)[0]
            steps = filter_pipeline(resolved, input_dir=work / "input", output_dir=out_dir,
                                    lists_root=Path("/"), model_path=model_path)  # list paths are absolute
            started = time.perf_counter()
            stats_path = executor.run(steps, logging_dir=work / "logs", tasks=min(source.filter.tasks, max(1, len(inputs))))
            seconds = time.perf_counter() - started
            counts = filter_counts(stats_path.parent)
            out_dir.mkdir(parents=True, exist_ok=True)
            files = [{"path": p.name, "records": _count_lines(p)} for p in sorted(out_dir.glob("*.jsonl.gz"))]
            kept = sum(f["records"] for f in files if f["path"].startswith("part-"))
            assert kept == counts["kept"], f"{kept} documents written but the writer counted {counts['kept']}"
            manifest = commit_folder(
                object_store,
                prefix,
                out_dir,
                {
                    **manifest_header(key.path, vkey, version, section, context.run.run_id),
                    "upstream": upstream,
                    "files": files,
                    "counts": counts,
                    "seconds": round(seconds, 3),
                },
            )
        shutil.rmtree(work, ignore_errors=True)
        # On the committed output, read back from the store: a reused output is checked as well.
        check = documents_check(object_store, {source.name: Output(key, prefix, manifest).files()}, {source.name: source.filter})

        counts = manifest["counts"]
        return committed_result(
            object_store,
            prefix,
            manifest,
            check_results=[check],
            metadata={
                "documents_in": counts["in"],
                "documents": counts["kept"],
                "dropped": sum(counts["dropped"].values()),
                "dropped_by_reason": MetadataValue.json(counts["dropped"]),
                "drop_table": MetadataValue.md(_drop_table(counts)),
                "drops_plot": bar_chart({"kept": counts["kept"], **counts["dropped"]}, title=f"{source.name}: kept and dropped by reason",
                                        ylabel="documents"),
                **_language_metadata(object_store, Output(key, prefix, manifest).files(), source),
                "pii_replaced": MetadataValue.json(counts["pii"]),
                "rejected_files": MetadataValue.json([f["path"] for f in manifest["files"] if f["path"].startswith("rejected-")]),
                # Of the run that computed this output (a reused output keeps its original figure).
                "docs_per_second": round(counts["in"] / manifest["seconds"], 1) if manifest.get("seconds") else 0.0,
                "version_key": vkey,
                "data_version": manifest["data_version"],
            },
        )

    return filtered


def quality_classifier_asset(recipe: Recipe, config: QualityClassifierConfig):
    section = pydantic.TypeAdapter(QualityClassifierConfig).dump_python(config, mode="json")
    version = code_version("quality_classifier", CLASSIFIER_IMPLEMENTATION, section)
    upstream_keys = [raw_crawl_key(name) for name in config.negative_sources]
    for name in config.negative_sources:
        recipe.source(name)  # KeyError naming the sources when a negative source does not exist

    @asset(
        key=CLASSIFIER_KEY,
        deps=upstream_keys,
        group_name="curation",
        code_version=version,
        kinds={"python"},
        description=(
            "fastText quality classifier: the recipe's reference texts (high quality) against raw web documents; "
            "accuracy on the human-labelled documents in the metadata. Driven by the recipe's `quality_classifier` section."
        ),
    )
    def quality_classifier(context: AssetExecutionContext, store: StoreResource, scratch: ScratchResource) -> MaterializeResult:
        object_store = store.open()
        files = {name: recipe.input_root / name for name in (*config.positive_files, *config.negative_files, *config.labelled_files)}
        for name, path in files.items():
            if not path.is_file():
                raise ValueError(f"quality_classifier: file {name!r} not found (looked for {path})")
        outputs = {k: latest_output(context.instance, object_store, k) for k in upstream_keys}
        upstream = {k.to_user_string(): out.data_version for k, out in outputs.items()}
        fingerprints = [f"{name}:{path.stat().st_size}" for name, path in files.items()]
        vkey = version_key(version, upstream=upstream, inputs=fingerprints)
        prefix = "/".join(CLASSIFIER_KEY.path + [vkey])

        manifest = read_manifest(object_store, prefix)
        if manifest is not None:
            context.log.info(f"{object_store.uri(prefix)} is already committed for this version; reusing it")
        else:
            work = scratch.new_dir("/".join(CLASSIFIER_KEY.path))
            negatives = [files[name].read_text(errors="replace") for name in config.negative_files]
            for out in outputs.values():
                for part in out.download(object_store, work / "input" / out.key.path[-2]):
                    negatives += [doc["text"] for doc in iter_documents(part)]
            positives = [files[name].read_text(errors="replace") for name in config.positive_files]
            labelled = read_labelled([files[name] for name in config.labelled_files])
            result = train_quality_classifier(config, positives=positives, negatives=negatives,
                                              out_path=work / "output" / MODEL_FILE, labelled=labelled)
            context.log.info(f"quality classifier: accuracy {result.accuracy} on {result.labelled} labelled documents")
            manifest = commit_folder(
                object_store,
                prefix,
                work / "output",
                {
                    **manifest_header(CLASSIFIER_KEY.path, vkey, version, section, context.run.run_id),
                    "upstream": upstream,
                    "inputs": fingerprints,
                    "counts": {"positives": result.positives, "negatives": result.negatives, "labelled": result.labelled},
                    "accuracy": result.accuracy,
                    "label_balance": result.label_balance,
                },
            )
            shutil.rmtree(work, ignore_errors=True)

        balance = manifest["label_balance"]
        return committed_result(
            object_store,
            prefix,
            manifest,
            metadata={
                "accuracy": manifest["accuracy"],
                "labelled_documents": manifest["counts"]["labelled"],
                # Chance for this label mix: always answering the majority label.
                "majority_baseline": None if balance is None else round(max(balance, 1 - balance), 4),
                "positives": manifest["counts"]["positives"],
                "negatives": manifest["counts"]["negatives"],
                "version_key": vkey,
                "data_version": manifest["data_version"],
            },
        )

    return quality_classifier


def curation_filter_assets(recipe: Recipe) -> list:
    """The quality classifier (when the recipe has one) and every source's filtered asset."""
    assets = [quality_classifier_asset(recipe, recipe.quality_classifier)] if recipe.quality_classifier else []
    return assets + [filtered_asset(recipe, source) for source in recipe.sources]


def _count_lines(path: Path) -> int:
    with gzip.open(path, "rb") as f:
        return sum(1 for _ in f)


def _language_metadata(object_store, parts: list[str], source: SourceConfig) -> dict:
    """The kept documents' languages (metadata.language, set by language ID), when the source's filter has it."""
    if source.filter.language is None:
        return {}
    languages = Counter(doc.get("metadata", {}).get("language", "?") for doc in read_documents(object_store, parts))
    ordered = dict(languages.most_common())
    return {
        "languages": count_table(ordered, key="language", value="documents"),
        "languages_plot": bar_chart(ordered, title=f"{source.name}: kept documents by language", ylabel="documents"),
    }


def _drop_table(counts: dict) -> str:
    rows = sorted(counts["dropped"].items(), key=lambda item: (-item[1], item[0]))
    lines = ["| reason | documents |", "|---|---|", *[f"| {reason} | {n} |" for reason, n in rows]]
    lines.append(f"| **kept** | {counts['kept']} of {counts['in']} |")
    return "\n".join(lines)
