"""`curation/quality_classifier`: linear models of reference text (recipe `quality_classifier.positive_files`)
against low-quality web text: the raw_crawl documents of `negative_sources`, the boilerplate the extractor dropped
from the pages of `boilerplate_sources` (their raw_crawl documents beside the source's own HTML), and
`negative_files`. Every model of pipelines/filters/quality.py MODELS is trained and scored on the labelled
documents (accuracy and ROC AUC, the majority baseline beside them, in the materialization metadata and the log);
the one `quality_classifier.model` names is the output, and a source whose filter has `quality_model` reads it.
"""

import pydantic
from dagster import AssetKey

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output
from assets.core.versioning import file_fingerprints
from assets.curation.raw_crawl import raw_crawl_key
from assets.recipe import Recipe
from pipelines.filters.quality import (
    MODELS,
    QualityClassifierConfig,
    boilerplate,
    read_labelled,
    train_quality_classifier,
)

CLASSIFIER_KEY = AssetKey(["curation", "quality_classifier"])
MODEL_FILE = "model.npy"


def quality_classifier_asset(recipe: Recipe, config: QualityClassifierConfig):
    section = pydantic.TypeAdapter(QualityClassifierConfig).dump_python(config, mode="json")
    for name in (*config.negative_sources, *config.boilerplate_sources):
        recipe.source(name)  # KeyError naming the sources when a negative source does not exist
    reads = {f"negative:{name}": raw_crawl_key(name) for name in config.negative_sources}
    reads.update({f"boilerplate:{name}": raw_crawl_key(name) for name in config.boilerplate_sources})

    def prepare(inputs: Inputs) -> Inputs:
        files = {name: recipe.input_root / name
                 for name in (*config.positive_files, *config.negative_files, *config.labelled_files)}
        for name, path in files.items():
            if not path.is_file():
                raise ValueError(f"quality_classifier: file {name!r} not found (looked for {path})")
        fingerprints = file_fingerprints(list(files.values()))  # by content: a relabelled file is a new version
        return inputs.but(fingerprints=fingerprints, manifest={"inputs": fingerprints}, extra={"files": files})

    def documents(inputs: Inputs, read: str) -> list[dict]:
        from pipelines.shards import iter_documents
        out = inputs.outputs[read]
        parts = out.download(inputs.store, inputs.work / "input" / out.key.path[-2])
        return [doc for part in parts for doc in iter_documents(part)]

    def build(inputs: Inputs, out_dir) -> dict:
        files = inputs.extra["files"]
        negatives = [files[name].read_text(errors="replace") for name in config.negative_files]
        for name in config.negative_sources:
            negatives += [doc["text"] for doc in documents(inputs, f"negative:{name}")]
        pages = 0
        for name in config.boilerplate_sources:
            dropped = source_boilerplate(recipe, name, documents(inputs, f"boilerplate:{name}"))
            pages += len(dropped)
            negatives += dropped.values()
        positives = [files[name].read_text(errors="replace") for name in config.positive_files]
        labelled = read_labelled([files[name] for name in config.labelled_files])
        models = {}
        for model in MODELS:  # every model, so the metadata compares them; the chosen one is the output
            path = out_dir / MODEL_FILE if model == config.model else inputs.work / "compared" / f"{model}.npy"
            result = train_quality_classifier(config, positives=positives, negatives=negatives, out_path=path,
                                              labelled=labelled, model=model)
            models[model] = {"accuracy": _rounded(result.accuracy), "roc_auc": _rounded(result.roc_auc)}
        figures = "; ".join(f"{m}{' (chosen)' if m == config.model else ''} accuracy {f['accuracy']} ROC AUC "
                            f"{f['roc_auc']}" for m, f in models.items())
        inputs.log.info(f"quality classifier on {result.labelled} labelled documents: {figures}; majority baseline "
                        f"{_majority(result.label_balance)}")
        return {"model": config.model, "models": models, "label_balance": result.label_balance,
                "counts": {"positives": result.positives, "negatives": result.negatives,
                           "boilerplate_pages": pages, "labelled": result.labelled}}

    def metadata(inputs: Inputs, output: Output) -> dict:
        manifest = output.manifest
        figures = {}
        for model, f in manifest["models"].items():
            figures[f"accuracy_{model}"] = f["accuracy"]
            figures[f"roc_auc_{model}"] = f["roc_auc"]
        chosen = manifest["models"][manifest["model"]]
        return {
            "model": manifest["model"],  # the one the quality_model filters use
            "accuracy": chosen["accuracy"],
            "roc_auc": chosen["roc_auc"],
            **figures,
            "labelled_documents": manifest["counts"]["labelled"],
            # Chance for this label mix: always answering the majority label (its ROC AUC is 0.5).
            "majority_baseline": _majority(manifest["label_balance"]),
            "positives": manifest["counts"]["positives"],
            "negatives": manifest["counts"]["negatives"],
            "boilerplate_pages": manifest["counts"]["boilerplate_pages"],
        }

    return output_asset(OutputSpec(
        key=CLASSIFIER_KEY, group="curation", stage="quality_classifier",
        section=section,
        description=(
            "Linear quality classifier: the recipe's reference texts (high quality) against raw web documents and "
            "the boilerplate the extractor dropped; each model's accuracy and ROC AUC on the human-labelled "
            "documents, beside the majority baseline, in the metadata. Driven by the recipe's `quality_classifier` "
            "section (`model` chooses the one the filters use)."
        ),
        reads=reads, prepare=prepare, build=build, metadata=metadata,
        failures=(ValueError,),  # a reference or labelled file the recipe names is missing
    ))


def source_boilerplate(recipe: Recipe, name: str, docs: list[dict]) -> dict[str, str]:
    """{document id: the lines its extraction dropped} for each HTML page of source `name` that raw_crawl kept
    (`docs`, its documents). The page is read again from the source's inputs; its main text is the document of
    the same id. Pages with nothing dropped are left out."""
    from pipelines.ingest.extraction import decode_text
    from pipelines.ingest.readers import read_inputs
    source = recipe.source(name)
    main = {doc["id"]: doc["text"] for doc in docs}
    found = {}
    for record in read_inputs(name, recipe.input_files(source), source.format, source.reader,
                              count_bytes=lambda size: None):
        if record.kind != "html" or record.id not in main:
            continue
        html, _ = decode_text(record.body, record.charset, html=True)
        if html is not None:
            found[record.id] = boilerplate(html, main[record.id])
    return {doc_id: text for doc_id, text in found.items() if text}


def _majority(balance: float | None) -> float | None:
    return None if balance is None else round(max(balance, 1 - balance), 4)


def _rounded(figure: float | None) -> float | None:
    return None if figure is None else round(figure, 4)
