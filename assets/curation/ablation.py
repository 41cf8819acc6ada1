"""`curation/<source>/ablation`: does the source's filter make better training data? Proxy models trained at equal
tokens and seed on the source's text before and after its filter, and compared (FineWeb's and DCLM's method).

Arms, each trained `repeats` times (seeds seed, seed + 1, ...), as the recipe's `ablation` section asks:

    raw                    the source's raw_crawl documents (extracted, not filtered)
    curated                its filtered documents (every step of its filter)
    without_<step>         raw through the filter with that one step left out (leave_one_out)
    <step>.<field>=<v>     raw through the filter with that setting changed (sweep)

An arm's documents are packed with the corpus tokenizer (assets/tokenization/packed.py pack_parts) and train the
proxy (training.main, mixing.proxy and ablation.proxy merged, as the mix sweep's) through the launcher resource.
Every arm is scored on the same text: the `reference` section's val_files, which no filter was trained on and no
source trains on, as validation-only domains (weight 0), and the zero-shot tasks of trainer/evaluation. Its own
held-out split differs per arm and is not compared. assets/curation/ablation_report.py turns the runs into the
differences from the raw arm and the verdicts.

Reuse: what each piece depends on is hashed into its key, and the piece is committed under this asset's prefix
(`<asset>/documents|packed|runs/<key>/`, manifest last) and reused by every later materialization that needs it. The
raw arm depends on the raw output, the tokenizer, the proxy settings and the seed, never on the filter: changing a
filter setting reruns only the arms whose documents changed. The asset's own version is the recipe section (with the
source's filter section when an arm runs the filter itself) and every read's data version, so a changed filter makes
only this source's ablation stale, and a changed `ablation` section only the ablations.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from dagster import AssetKey, Failure, MetadataValue

from assets.core.factory import Inputs, OutputSpec, output_asset
from assets.core.lineage import lineage
from assets.core.source_hash import code_digest
from assets.core.upstream import Output
from assets.core.versioning import file_fingerprints
from assets.curation.ablation_report import CURATED, METRICS, RAW, WITHOUT, summarize, table
from assets.curation.filtered import filter_code, filtered_key, resolved_filter, run_filter
from assets.curation.quality_classifier import CLASSIFIER_KEY
from assets.curation.raw_crawl import raw_crawl_key
from assets.curation.reference_lm import REFERENCE_KEY
from assets.plots import grouped_bar_chart
from assets.recipe import Recipe, SourceConfig
from assets.recipe.training import proxy_run
from assets.tokenization.packed import pack_parts
from assets.tokenization.tokenizer import TOKENIZER_FILE, tokenizer_key
from assets.training.inputs import local_folder
from pipelines.filters.config import FilterConfig
from pipelines.tokenization.config import PackingConfig
from storage.manifest import commit_folder, read_manifest

RESULT_FILE = "result.json"
REFERENCE_DOMAIN = "reference_"  # a validation domain's name: reference_<val file's stem>
ARM_DOMAIN = "arm"  # the arm's own text: its held-out split is reported, never compared (each arm's differs)
SHARD = "part-00000"  # a reference text's one packed shard
# The code that makes each piece reused across builds, part of that piece's key: a piece made by other code is made
# again. A packed reference text: its paragraphs as the reference model reads them, tokenized and packed.
REFERENCE_CODE = ("assets.curation.ablation:_reference_domain,SHARD",
                  "pipelines.filters.perplexity:read_reference_text,reference_paragraphs",
                  "pipelines.tokenization.tokenizer", "pipelines.tokenization.packed_format")
PACK_CODE = ("assets.tokenization.packed:pack_parts", "pipelines.tokenization.pack")
# A proxy run's figures: the trainer, and what reads its results into result.json.
RUN_CODE = ("trainer", "assets.curation.ablation:_train,RESULT_FILE,REFERENCE_DOMAIN")
# Zero-shot tasks at the end only: an interval no arm reaches (the trainer always evaluates at its last step).
AT_THE_END = 1 << 30


def ablation_key(source_name: str) -> AssetKey:
    return AssetKey(["curation", source_name, "ablation"])


@dataclass(frozen=True)
class Arm:
    name: str
    filter: FilterConfig | None = None  # None: the raw or the curated documents as they are


def arms_of(recipe: Recipe, source: SourceConfig, resolved: FilterConfig) -> list[Arm]:
    """The source's arms: raw and curated, then one per step left out, then one per swept value."""
    section = recipe.ablation
    arms = [Arm(RAW), Arm(CURATED)]
    steps = [f.name for f in dataclasses.fields(FilterConfig) if getattr(source.filter, f.name) is not None]
    left_out = steps if section.leave_one_out is True else \
        [s for s in (section.leave_one_out or []) if s in steps]
    arms += [Arm(f"{WITHOUT}{step}", dataclasses.replace(resolved, **{step: None})) for step in left_out]
    if section.sweep is not None:
        step, _, name = section.sweep.setting.partition(".")
        if getattr(resolved, step) is not None:
            for value in section.sweep.values:
                changed = dataclasses.replace(getattr(resolved, step), **{name: value})
                arms.append(Arm(f"{step}.{name}={value}", dataclasses.replace(resolved, **{step: changed})))
    return arms


def arm_settings(recipe: Recipe) -> tuple[dict, dict]:
    """(the proxy's run-config fields, its launch settings): training.main, mixing.proxy and ablation.proxy merged,
    at the section's tokens, without checkpoints or TensorBoard."""
    mixing = [("mixing.proxy", recipe.mixing.proxy)] if recipe.mixing else []
    settings, launch = proxy_run(recipe.training.main, *mixing, ("ablation.proxy", recipe.ablation.proxy),
                                 train_tokens=recipe.ablation.tokens)
    return settings, launch.overrides()


def ablation_asset(recipe: Recipe, source: SourceConfig):
    section = recipe.ablation
    key = ablation_key(source.name)
    resolved, lists = resolved_filter(recipe, source)
    arms = arms_of(recipe, source, resolved)
    variants = [arm.filter for arm in arms if arm.filter is not None]
    needs_model = any(f.quality_model is not None for f in variants)
    needs_reference = any(f.perplexity is not None for f in variants)
    reads = {"raw": raw_crawl_key(source.name), "filtered": filtered_key(source.name), "tokenizer": tokenizer_key(),
             **({"model": CLASSIFIER_KEY} if needs_model else {}),
             **({"reference": REFERENCE_KEY} if needs_reference else {})}
    settings, launch = arm_settings(recipe)
    tasks = list(section.tasks if section.tasks is not None else recipe.evaluation.tasks)
    seeds = [section.seed + i for i in range(section.repeats)]
    val_files = [recipe.input_root / name for name in recipe.reference.val_files]
    run_code = code_digest(RUN_CODE)
    pack_code = code_digest(PACK_CODE)
    own_section = {k: v for k, v in section.model_dump(mode="json").items() if k not in ("sources", "proxy")}

    def prepare(inputs: Inputs) -> Inputs:
        # The reference texts are read from outside the store: their contents are part of the version.
        return inputs.but(fingerprints=file_fingerprints(val_files))

    def build(inputs: Inputs, out_dir: Path) -> dict:
        store, work, out = inputs.store, inputs.work, inputs.outputs
        tokenizer = out["tokenizer"]
        [tokenizer_file] = tokenizer.download(store, work / "tokenizer", TOKENIZER_FILE)
        cache = work / "cache"
        references = {f"{REFERENCE_DOMAIN}{_stem(path)}": _reference_domain(inputs, path, tokenizer, tokenizer_file)
                      for path in val_files}
        reference_folders = {domain: local_folder(store, output, cache) for domain, output in references.items()}
        results, trained, reused = [], [], []
        started = time.perf_counter()
        for arm in arms:
            keys, identity, roots = _arm_documents(inputs, arm)
            packed, _ = _committed(inputs, "packed", {"documents": identity, "tokenizer": tokenizer.data_version,
                                                   "packing": dataclasses.asdict(recipe.packing), "code": pack_code},
                                lambda folder: pack_parts(inputs, keys, tokenizer, folder, name=f"{source.name}-{arm.name}",
                                                          config=recipe.packing))
            folder = local_folder(store, packed, cache)
            records = lineage(inputs.context.instance, store, [*roots, tokenizer])
            for seed in seeds:
                run = {**settings, "seed": seed, "stage": f"ablation-{source.name}-{arm.name}-seed{seed}",
                       "data": {"shards": {ARM_DOMAIN: str(folder), **{d: str(f) for d, f in reference_folders.items()}},
                                "weights": {ARM_DOMAIN: 1.0, **{d: 0.0 for d in references}},
                                "tokenizer": str(tokenizer_file)},
                       "metrics": {**settings.get("metrics", {}), "eval_interval": 0, "eval_batches": section.eval_batches,
                                   "tensorboard": False, "downstream_interval": AT_THE_END if tasks else 0,
                                   "downstream_tasks": tasks, "downstream_limit": section.limit,
                                   "downstream_benchmarks": str(recipe.input_root / recipe.evaluation.benchmarks)},
                       "tokenizer_sha256": tokenizer.manifest["tokenizer"]["sha256"], "lineage": records}
                # What the run's figures depend on: its data by version (not by where this build found it), its
                # settings, the trainer's code.
                identity_of_run = {"packed": packed.data_version, "tokenizer": tokenizer.data_version,
                                   "references": sorted((d, out.data_version) for d, out in references.items()),
                                   "run": {k: v for k, v in run.items() if k not in ("data", "lineage")},
                                   "code": run_code}
                label = f"{arm.name} seed {seed}"
                result, made = _committed(inputs, "runs", identity_of_run, lambda folder: _train(
                    inputs, run, folder, arm=arm.name, seed=seed, launch=launch, packed=packed, records=records))
                (trained if made else reused).append(label)
                results.append(json.loads(store.get_bytes(f"{result.prefix}/{RESULT_FILE}")))
        summary = summarize(results)
        (out_dir / RESULT_FILE).write_text(json.dumps({"summary": summary, "runs": results}, indent=1, sort_keys=True))
        inputs.log.info(f"{source.name} ablation: {len(trained)} run(s) trained, {len(reused)} reused; "
                        + "; ".join(summary["verdict"]))
        return {"counts": {"arms": len(arms), "runs": len(results), "trained": len(trained), "reused": len(reused)},
                "runs": {"trained": trained, "reused": reused}, "seconds": round(time.perf_counter() - started, 3)}

    def metadata(inputs: Inputs, output: Output) -> dict:
        payload = json.loads(inputs.store.get_bytes(f"{output.prefix}/{RESULT_FILE}"))
        summary = payload["summary"]
        arms_figures = summary["arms"]
        losses = {name: {METRICS[k]: m["mean"] for k, m in f["metrics"].items()} for name, f in arms_figures.items()}
        spread = {name: {METRICS[k]: (m["spread"] or 0.0) / 2 for k, m in f["metrics"].items()}
                  for name, f in arms_figures.items()}
        return {
            "verdict": MetadataValue.md("\n".join(f"- {line}" for line in summary["verdict"]) or "one arm only"),
            "verdict_text": "\n".join(summary["verdict"]),  # `pretrain status` prints it
            "arms": MetadataValue.md(table(summary)),
            "arm_figures": MetadataValue.json(arms_figures),
            "step_verdicts": MetadataValue.json(summary["steps"]),
            "difference_from_raw": MetadataValue.json({name: f.get("difference") for name, f in arms_figures.items()
                                                       if name != RAW}),
            "runs_trained": output.manifest["counts"]["trained"],
            "runs_reused": output.manifest["counts"]["reused"],
            "loss_plot": grouped_bar_chart(losses, errors=spread, ylabel="reference loss; answer bits per byte",
                                           title=f"{source.name}: each metric per arm (bars: half the seed range)"),
        }

    return output_asset(OutputSpec(
        key=key, group="curation", stage="ablation",
        code=("trainer", *PACK_CODE, "assets.curation.ablation_report",
              *(("assets.curation.filtered:run_filter", *filter_code(resolved)) if variants else ())),
        # The arms that run the filter themselves (a step left out, a setting changed) depend on its settings; raw
        # and curated only on the outputs they read.
        section={"ablation": own_section, "proxy": settings, "tasks": tasks, "arms": [a.name for a in arms],
                 **({"source": source.filtered_section(), "lists": lists} if variants else {})},
        description=(f"Does `{source.name}`'s filter help? Proxy runs of {section.tokens:,} tokens on its raw and "
                     f"curated text ({', '.join(a.name for a in arms)}), {section.repeats} seed(s) each, scored on "
                     "reference.val_files and zero-shot tasks. Driven by the recipe's `ablation` section."),
        reads=reads, prepare=prepare, build=build, metadata=metadata,
        resources=frozenset({"executor", "launcher"}), failures=(ValueError,), out_name="result",
        asset_args={"metadata": {"launch": MetadataValue.json(launch)}},
    ))


def _arm_documents(inputs: Inputs, arm: Arm) -> tuple[list[str], dict, list[Output]]:
    """(store keys of the arm's document parts, what they depend on, the outputs its lineage starts from)."""
    out = inputs.outputs
    if arm.name == RAW:
        return out["raw"].files(), {"raw": out["raw"].data_version}, [out["raw"]]
    if arm.name == CURATED:
        return out["filtered"].files(), {"filtered": out["filtered"].data_version}, [out["filtered"]]
    used = [name for name in ("model", "reference") if name in out]
    identity = {"raw": out["raw"].data_version, "filter": json.dumps(dataclasses.asdict(arm.filter), sort_keys=True),
                "code": code_digest(("assets.curation.filtered:run_filter", *filter_code(arm.filter))),
                **{name: out[name].data_version for name in used}}
    documents, _ = _committed(inputs, "documents", identity, lambda folder: run_filter(
        inputs, arm.filter, folder, raw=out["raw"], model=out.get("model"), reference=out.get("reference"),
        logs=f"filter-{arm.name}"))
    return documents.files(), {"documents": documents.data_version}, [out["raw"], *[out[n] for n in used]]


def _reference_domain(inputs: Inputs, path: Path, tokenizer: Output, tokenizer_file: Path) -> Output:
    """A reference val file packed with the tokenizer as a validation-only domain: one document per paragraph,
    every one in the val split (packed as train, then moved: the trainer opens only the val split of a domain of
    weight 0)."""
    from tokenizers import Tokenizer

    identity = {"file": file_fingerprints([path]), "tokenizer": tokenizer.data_version,
                "code": code_digest(REFERENCE_CODE)}

    def make(folder: Path) -> dict:
        from pipelines.filters.perplexity import read_reference_text, reference_paragraphs
        from pipelines.tokenization.packed_format import INDEX_FILE, build_index, shard_files, write_index
        from pipelines.tokenization.tokenizer import pack_documents, token_dtype
        loaded = Tokenizer.from_file(str(tokenizer_file))
        vocab_size = loaded.get_vocab_size(with_added_tokens=True)
        eos_id = tokenizer.manifest["tokenizer"]["eos_id"]
        paragraphs = reference_paragraphs(read_reference_text(path))
        docs = ({"id": f"{path.name}#{i}", "text": text} for i, text in enumerate(paragraphs))
        pack_documents(docs, loaded, eos_id=eos_id, out_dir=folder, config=PackingConfig(val_fraction=0.0))
        for train_file, val_file in zip(shard_files("train", SHARD), shard_files("val", SHARD)):  # all held out
            (folder / val_file).parent.mkdir(parents=True, exist_ok=True)
            (folder / train_file).rename(folder / val_file)
        index = build_index(folder, [SHARD], dtype=token_dtype(vocab_size).name, eos_id=eos_id,
                            vocab_size=vocab_size)
        write_index(folder, index)
        return {"packing": json.loads((folder / INDEX_FILE).read_text()), "documents": len(paragraphs)}

    return _committed(inputs, "references", identity, make)[0]


def _train(inputs: Inputs, run: dict, folder: Path, *, arm: str, seed: int, launch: dict, packed: Output,
           records: list[dict]) -> dict:
    """One proxy run of one arm and seed; its figures go to folder/result.json."""
    work = inputs.work / "runs" / f"{arm}-seed{seed}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    result = inputs.resources.launcher.launch(inputs.context, {**run, "output_dir": str(work / "out")}, work,
                                              settings=launch)
    val = result.summary.get("val_loss") or {}
    reference = {d: v for d, v in val.items() if d.startswith(REFERENCE_DOMAIN)}
    if not reference:
        raise Failure(description=f"the {arm} arm (seed {seed}) reported no loss on the reference texts: "
                                  f"validation losses {sorted(val)}")
    downstream = result.events("downstream")
    tasks = downstream[-1]["tasks"] if downstream else {}
    zero_shot = {task: r.get(r["metric"]) for task, r in tasks.items()}
    # DataDecide's continuous metric: bits per byte of each task's correct answers (assets/curation/ablation_report.py)
    answer_bpb = {task: r["bpb"] for task, r in tasks.items() if r.get("bpb") is not None}
    figures = {"arm": arm, "seed": seed, "tokens": result.summary.get("tokens"), "steps": result.summary.get("steps"),
               "val_loss": reference, "own_val_loss": {d: v for d, v in val.items() if d not in reference},
               "reference_loss": sum(reference.values()) / len(reference), "zero_shot": zero_shot,
               "answer_bpb": answer_bpb,
               "documents": packed.manifest["counts"]["train"]["documents"] + packed.manifest["counts"]["val"]["documents"],
               "data": {r["asset"]: r["data_version"] for r in records}}
    (folder / RESULT_FILE).write_text(json.dumps(figures, indent=1, sort_keys=True))
    shutil.rmtree(work, ignore_errors=True)
    return {"arm": arm, "seed": seed}


def _committed(inputs: Inputs, kind: str, identity: dict, make) -> tuple[Output, bool]:
    """The piece of this ablation that `identity` decides, committed under <asset>/<kind>/<its key>: read back when
    it is there, else made by `make(folder) -> manifest fields` in a scratch folder and committed (manifest last);
    and whether it was made now."""
    key = inputs.context.asset_key
    prefix = _prefix(key, kind, identity)
    manifest = read_manifest(inputs.store, prefix)
    made = manifest is None
    if made:
        folder = inputs.work / "make" / kind / prefix.rsplit("/", 1)[-1]
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        fields = make(folder)
        manifest = commit_folder(inputs.store, prefix, folder, {"identity": identity, **fields})
        shutil.rmtree(folder, ignore_errors=True)
    return Output(key, prefix, manifest), made


def _prefix(key: AssetKey, kind: str, identity: dict) -> str:
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:32]
    return "/".join([*key.path, kind, digest])


def _stem(path: Path) -> str:
    return path.name.split(".", 1)[0]
