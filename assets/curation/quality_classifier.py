"""`curation/quality_classifier`: a fastText model of reference text (recipe `quality_classifier.positive_files`)
against raw web documents (`negative_sources`' raw_crawl outputs, `negative_files`); its accuracy on the
labelled documents is in the materialization metadata. A source whose filter has `quality_model` reads it.
"""

import pydantic
from dagster import AssetKey

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.upstream import Output
from assets.core.versioning import file_fingerprints
from assets.curation.raw_crawl import raw_crawl_key
from assets.recipe import Recipe
from pipelines.shards import iter_documents
from pipelines.filters.quality import QualityClassifierConfig, read_labelled, train_quality_classifier

CLASSIFIER_KEY = AssetKey(["curation", "quality_classifier"])
MODEL_FILE = "model.npy"


def quality_classifier_asset(recipe: Recipe, config: QualityClassifierConfig):
    section = pydantic.TypeAdapter(QualityClassifierConfig).dump_python(config, mode="json")
    for name in config.negative_sources:
        recipe.source(name)  # KeyError naming the sources when a negative source does not exist

    def prepare(inputs: Inputs) -> Inputs:
        files = {name: recipe.input_root / name
                 for name in (*config.positive_files, *config.negative_files, *config.labelled_files)}
        for name, path in files.items():
            if not path.is_file():
                raise ValueError(f"quality_classifier: file {name!r} not found (looked for {path})")
        fingerprints = file_fingerprints(list(files.values()))  # by content: a relabelled file is a new version
        return inputs.but(fingerprints=fingerprints, manifest={"inputs": fingerprints}, extra={"files": files})

    def build(inputs: Inputs, out_dir) -> dict:
        files = inputs.extra["files"]
        negatives = [files[name].read_text(errors="replace") for name in config.negative_files]
        for out in inputs.outputs.values():
            for part in out.download(inputs.store, inputs.work / "input" / out.key.path[-2]):
                negatives += [doc["text"] for doc in iter_documents(part)]
        positives = [files[name].read_text(errors="replace") for name in config.positive_files]
        labelled = read_labelled([files[name] for name in config.labelled_files])
        result = train_quality_classifier(config, positives=positives, negatives=negatives,
                                          out_path=out_dir / MODEL_FILE, labelled=labelled)
        inputs.log.info(f"quality classifier: accuracy {result.accuracy} on {result.labelled} labelled documents")
        return {"counts": {"positives": result.positives, "negatives": result.negatives, "labelled": result.labelled},
                "accuracy": result.accuracy, "label_balance": result.label_balance}

    def metadata(inputs: Inputs, output: Output) -> dict:
        manifest = output.manifest
        balance = manifest["label_balance"]
        return {
            "accuracy": manifest["accuracy"],
            "labelled_documents": manifest["counts"]["labelled"],
            # Chance for this label mix: always answering the majority label.
            "majority_baseline": None if balance is None else round(max(balance, 1 - balance), 4),
            "positives": manifest["counts"]["positives"],
            "negatives": manifest["counts"]["negatives"],
        }

    return output_asset(OutputSpec(
        key=CLASSIFIER_KEY, group="curation", stage="quality_classifier",
        section=section,
        description=(
            "fastText quality classifier: the recipe's reference texts (high quality) against raw web documents; "
            "accuracy on the human-labelled documents in the metadata. Driven by the recipe's `quality_classifier` "
            "section."
        ),
        reads={name: raw_crawl_key(name) for name in config.negative_sources},
        prepare=prepare, build=build, metadata=metadata,
        failures=(ValueError,),  # a reference or labelled file the recipe names is missing
    ))
