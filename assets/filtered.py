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
from pathlib import Path

import pydantic
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    MaterializeResult,
    MetadataValue,
    asset,
)

from assets.curation import raw_crawl_key
from assets.recipe import DEMO_RECIPE, Recipe, SourceConfig
from assets.upstream import committed_result, latest_output
from assets.versioning import code_version, manifest_header, version_key
from pipelines.filters import FilterConfig, filter_counts, filter_pipeline, find_pii
from pipelines.ingest import iter_documents
from pipelines.quality_model import QualityClassifierConfig, read_labelled, train_quality_classifier
from resources.executor import ExecutorResource
from resources.scratch import ScratchResource
from resources.store import commit_folder, read_manifest
from resources.store_resource import StoreResource

# Bump when the filter or classifier code changes what it writes for the same settings.
FILTERED_IMPLEMENTATION = "v1"
CLASSIFIER_IMPLEMENTATION = "v1"
CLASSIFIER_KEY = AssetKey(["curation", "quality_classifier"])
MODEL_FILE = "model.npy"
CHECK_NAME = "documents_valid"
MAX_TEXT_CHARS = 8 * 2**20  # the reader's max_document_bytes default: nothing longer can come out of ingest


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
        check_specs=[AssetCheckSpec(
            CHECK_NAME, asset=key,
            description="great-expectations on the kept documents: non-empty text within length bounds, unique ids, "
                        "languages in the source's allowed set, no PII pattern left.",
        )],
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
            for entry in manifest["files"]:
                if entry["path"].startswith("part-"):
                    object_store.download(f"{prefix}/{entry['path']}", out_dir / entry["path"])
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
        check = _check_documents(out_dir, source.filter)
        shutil.rmtree(work, ignore_errors=True)

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
            "accuracy on the human-labelled documents in the metadata."
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


def validate_documents(docs: list[dict], config: FilterConfig) -> tuple[bool, dict]:
    """great-expectations 1.x, called directly (dagster-ge needs GE < 1, STACK.md), on the kept documents.

    Returns (success, {expectation: {"success", "unexpected", "examples"}})."""
    import great_expectations as gx
    import pandas as pd

    if not docs:  # nothing kept (e.g. a one-page source whose page went at language ID): nothing to violate
        return True, {}
    frame = pd.DataFrame({
        "id": [d["id"] for d in docs],
        "text": [d["text"] for d in docs],
        "language": [d["metadata"].get("language", "") for d in docs],
        "pii_left": [sum(map(len, find_pii(d["text"], config.pii).values())) if config.pii else 0 for d in docs],
    })
    expectations = [
        gx.expectations.ExpectColumnValuesToNotBeNull(column="text"),
        gx.expectations.ExpectColumnValueLengthsToBeBetween(column="text", min_value=1, max_value=MAX_TEXT_CHARS),
        gx.expectations.ExpectColumnValuesToBeUnique(column="id"),
        gx.expectations.ExpectColumnValuesToBeBetween(column="pii_left", min_value=0, max_value=0),
    ]
    if config.language:
        expectations.append(gx.expectations.ExpectColumnValuesToBeInSet(column="language", value_set=list(config.language.languages)))
    context = gx.get_context(mode="ephemeral")
    batch = (context.data_sources.add_pandas("filtered").add_dataframe_asset("documents")
             .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame}))
    result = batch.validate(gx.ExpectationSuite(name="filtered_documents", expectations=expectations))
    details = {}
    for r in result.results:
        name = r.expectation_config.type + (f"({r.expectation_config.kwargs.get('column')})")
        details[name] = {"success": bool(r.success), "unexpected": int(r.result.get("unexpected_count") or 0),
                         "examples": [str(x)[:80] for x in (r.result.get("partial_unexpected_list") or [])[:5]]}
    return bool(result.success), details


def _check_documents(folder: Path, config: FilterConfig) -> AssetCheckResult:
    docs = [d for part in sorted(folder.glob("part-*.jsonl.gz")) for d in iter_documents(part)]
    success, details = validate_documents(docs, config)
    return AssetCheckResult(
        check_name=CHECK_NAME,
        passed=success,
        severity=AssetCheckSeverity.ERROR,
        metadata={"documents": len(docs), "expectations": MetadataValue.json(details)},
    )


def _count_lines(path: Path) -> int:
    with gzip.open(path, "rb") as f:
        return sum(1 for _ in f)


def _drop_table(counts: dict) -> str:
    rows = sorted(counts["dropped"].items(), key=lambda item: (-item[1], item[0]))
    lines = ["| reason | documents |", "|---|---|", *[f"| {reason} | {n} |" for reason, n in rows]]
    lines.append(f"| **kept** | {counts['kept']} of {counts['in']} |")
    return "\n".join(lines)
