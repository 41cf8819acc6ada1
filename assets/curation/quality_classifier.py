"""`curation/quality_classifier`: linear models of reference text (recipe `quality_classifier.positive_files`)
against low-quality web text: the raw_crawl documents of `negative_sources`, the boilerplate the extractor dropped
from the pages of `boilerplate_sources` (their raw_crawl documents beside the source's own HTML), and
`negative_files`. The labelled documents are split in two (`held_out_fraction`, by a hash of their text): every model
of pipelines/filters/quality.py MODELS is trained and scored on the selection part, where models and settings are
compared; the one `quality_classifier.model` names is the output, and it alone is scored on the held-out part, the
figure measured on labels no choice was made on. Both, with the majority baseline beside them, are in the
materialization metadata and the log. A source whose filter has `quality_model` reads the model.
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
    LabelledScore,
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
        models, held_out = {}, None
        for model in MODELS:  # every model, so the metadata compares them; the chosen one is the output
            path = out_dir / MODEL_FILE if model == config.model else inputs.work / "compared" / f"{model}.npy"
            result = train_quality_classifier(config, positives=positives, negatives=negatives, out_path=path,
                                              labelled=labelled, model=model)
            models[model] = _figures(result.selection)
            if model == config.model:
                held_out = _figures(result.held_out)  # the others are never scored there: no choice sees it
        compared = "; ".join(f"{m}{' (chosen)' if m == config.model else ''} accuracy {f['accuracy']} ROC AUC "
                             f"{f['roc_auc']}" for m, f in models.items() if f)
        if held_out:
            inputs.log.info(f"quality classifier, {held_out['documents']} held-out labelled documents: "
                            f"{config.model} accuracy {held_out['accuracy']} ROC AUC {held_out['roc_auc']}, majority "
                            f"baseline {held_out['majority_baseline']}; on the {models[config.model]['documents']} "
                            f"the models are compared on: {compared}")
        return {"model": config.model, "models": models, "held_out": held_out,
                "counts": {"positives": result.positives, "negatives": result.negatives, "boilerplate_pages": pages}}

    def metadata(inputs: Inputs, output: Output) -> dict:
        manifest = output.manifest
        held_out = manifest["held_out"] or {}
        selection = manifest["models"][manifest["model"]] or {}
        figures = {}
        for model, f in manifest["models"].items():  # compared on the selection part
            figures[f"accuracy_{model}"] = (f or {}).get("accuracy")
            figures[f"roc_auc_{model}"] = (f or {}).get("roc_auc")
        return {
            "model": manifest["model"],  # the one the quality_model filters use
            # Measured on labelled documents no choice was made on: the figures to trust.
            "roc_auc_held_out": held_out.get("roc_auc"),
            "accuracy_held_out": held_out.get("accuracy"),
            "held_out_documents": held_out.get("documents"),
            # Chance for this label mix: always answering the majority label (its ROC AUC is 0.5).
            "majority_baseline_held_out": held_out.get("majority_baseline"),
            # In-sample: the part where the models, the negatives and l2 were compared and chosen.
            "roc_auc_selection": selection.get("roc_auc"),
            "accuracy_selection": selection.get("accuracy"),
            "selection_documents": selection.get("documents"),
            **figures,
            "positives": manifest["counts"]["positives"],
            "negatives": manifest["counts"]["negatives"],
            "boilerplate_pages": manifest["counts"]["boilerplate_pages"],
        }

    return output_asset(OutputSpec(
        key=CLASSIFIER_KEY, group="curation", stage="quality_classifier",
        section=section,
        description=(
            "Linear quality classifier: the recipe's reference texts (high quality) against raw web documents and "
            "the boilerplate the extractor dropped. The human-labelled documents are split: each model's accuracy and "
            "ROC AUC on the selection part, where they are compared, and the chosen model's on the held-out part, "
            "beside the majority baseline, in the metadata. Driven by the recipe's `quality_classifier` section "
            "(`model` chooses the one the filters use)."
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


def _figures(score: LabelledScore | None) -> dict | None:
    if score is None:  # no labelled files
        return None
    return {"documents": score.documents, "accuracy": round(score.accuracy, 4),
            "roc_auc": None if score.roc_auc is None else round(score.roc_auc, 4),
            "majority_baseline": round(max(score.label_balance, 1 - score.label_balance), 4)}
