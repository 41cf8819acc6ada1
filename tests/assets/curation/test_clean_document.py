"""A clean real document goes through every curation stage and into the packed shards unchanged; what must go, goes.

One small JSONL source built from real documents of ../shared/data (Guardian articles, Dolma documents, C4 pages),
materialized through the assets (raw_crawl -> filtered -> deduplicated -> decontaminated -> tokenizer -> packed)
with the demo's prose filter settings, plus three planted documents: a Guardian article copied with small edits
(a near-duplicate), a real C4 page carrying a GSM8K test problem (contamination), and a real C4 page with planted
PII (scrubbed, then kept).
"""

import gzip
import json
import random

import numpy as np
import orjson
import pytest
import yaml
from dagster import AssetCheckKey, AssetKey, DagsterInstance
from tokenizers import Tokenizer

from assets.cli import main
from assets.recipe import DEMO_RECIPE
from pipelines.tokenization.config import PackingConfig
from pipelines.tokenization.tokenizer import is_val
from trainer.data.mixture import PackedSource

SOURCE = "pages"
CLEAN_ID = "guardian-0"  # a long Guardian article: English prose, no PII pattern, no benchmark text
PII = {  # planted value -> the placeholder the scrubber must leave
    "jane.doe@example.org": "<EMAIL>",
    "+44 20 7946 0958": "<PHONE>",
    "192.168.10.24": "<IPV4>",
    "AKIAIOSFODNN7EXAMPLE": "<AWS_ACCESS_KEY>",
}


def real_documents(shared_data) -> dict[str, str]:
    def read(name):
        return [json.loads(line)["text"] for line in gzip.open(shared_data / "jsonl" / name)]

    docs = {f"guardian-{i}": t for i, t in enumerate(read("olmo_c4_100_domains_theguardian.jsonl.gz"))}
    docs |= {f"dolma-{i}": t for i, t in enumerate(read("dolma_provided_documents_000.json.gz"))}
    docs |= {f"c4-{i}": t for i, t in enumerate(read("olmo_c4-sample.01.json.gz"))}
    return docs


def write_source(path, shared_data) -> dict:
    docs = real_documents(shared_data)
    # Hosts of the planted documents are taken out of the source, so each planted one is its only copy.
    contaminated_host, pii_host = docs.pop("c4-1"), docs.pop("c4-2")
    question = json.loads(open(shared_data / "benchmarks" / "gsm8k_test.jsonl").readline())["question"]
    words = docs["guardian-1"].split(" ")
    rng = random.Random(0)
    for _ in range(3):
        words[rng.randrange(len(words))] = "updated"
    planted = {  # ids sort after the real ones: dedup keeps the smallest id of a cluster
        "zz-near-copy": " ".join(words) + "\nShare this article.",
        "zz-contaminated": contaminated_host + "\n\nToday's puzzle: " + question + "\n\nPost your answer below.",
        "zz-pii": pii_host + "\n\nQuestions? Write to jane.doe@example.org or call +44 20 7946 0958. "
                  "Our mirror runs at 192.168.10.24 and the upload key is AKIAIOSFODNN7EXAMPLE.",
    }
    rows = [{"id": i, "text": t} for i, t in docs.items()] + [{"id": i, "text": t} for i, t in planted.items()]
    path.write_text("".join(orjson.dumps(row).decode() + "\n" for row in rows))
    return {"docs": docs, "planted": planted}


def write_recipe(path, source_file):
    demo = yaml.safe_load(DEMO_RECIPE.read_text())
    c4_filter = next(s for s in demo["sources"] if s["name"] == "c4")["filter"]
    c4_filter.pop("url")  # the pages carry no URLs
    raw = {
        "name": "clean-document",
        "base_dir": str((DEMO_RECIPE.parent / demo["base_dir"]).resolve()),
        "sources": [{"name": SOURCE, "format": "jsonl", "inputs": [str(source_file)], "filter": c4_filter}],
        "dedup": demo["dedup"],
        "decontamination": {**demo["decontamination"], "benchmarks": ["benchmarks/gsm8k_test.jsonl"]},
        "tokenizer": {"vocab_size": 1024, "sample_bytes": 400_000},  # small: trains in about a second
        "packing": {"val_fraction": 0.1},
    }
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return raw


def metadata(key: str) -> dict:
    event = DagsterInstance.get().get_latest_materialization_event(AssetKey(key.split("/")))
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def read_docs(store_root, prefix, pattern="part-*.jsonl.gz") -> dict[str, dict]:
    docs = {}
    for part in sorted((store_root / prefix).glob(pattern)):
        for line in gzip.open(part):
            doc = orjson.loads(line)
            docs[doc["id"]] = doc
    return docs


@pytest.mark.slow  # materializes assets through the CLI
def test_a_clean_document_survives_every_stage_unchanged(tmp_path, monkeypatch, shared_data, pretrain_home):
    source_file = tmp_path / "pages.jsonl"
    facts = write_source(source_file, shared_data)
    recipe_path = tmp_path / "recipe.yaml"
    recipe = write_recipe(recipe_path, source_file)
    monkeypatch.setenv("PRETRAIN_RECIPE", str(recipe_path))

    assert main(["materialize", "--select", f"+tokenization/{SOURCE}/packed"]) == 0
    store = pretrain_home / "store"
    stages = {
        stage: read_docs(store, metadata(f"curation/{SOURCE}/{stage}")["prefix"])
        for stage in ("raw_crawl", "filtered", "decontaminated")
    }
    stages["deduplicated"] = read_docs(store, metadata("curation/deduplicated")["prefix"], f"{SOURCE}/part-*.jsonl.gz")
    clean = facts["docs"][CLEAN_ID]
    for stage in ("raw_crawl", "filtered", "deduplicated", "decontaminated"):
        assert stages[stage][CLEAN_ID]["text"] == clean, stage  # byte-identical at every stage

    # The near-copy goes at dedup, in the original's cluster; the contaminated page at decontamination.
    dedup_removed = read_docs(store, metadata("curation/deduplicated")["prefix"], f"{SOURCE}/removed-*.jsonl.gz")
    assert "zz-near-copy" in stages["filtered"] and "zz-near-copy" not in stages["deduplicated"]
    assert dedup_removed["zz-near-copy"]["metadata"]["dup_cluster"] == f"{SOURCE}/guardian-1"
    assert "guardian-1" in stages["deduplicated"]
    decontam = metadata(f"curation/{SOURCE}/decontaminated")
    assert "zz-contaminated" in stages["deduplicated"] and "zz-contaminated" not in stages["decontaminated"]
    assert decontam["dropped"] == 1 and decontam["hits_per_benchmark"] == {"gsm8k_test": 1}
    removed = read_docs(store, decontam["prefix"], "removed-*.jsonl.gz")
    assert removed["zz-contaminated"]["metadata"]["contaminated_by"] == ["gsm8k_test"]

    # Planted PII is replaced by typed placeholders in the filtered output and stays so downstream.
    assert facts["planted"]["zz-pii"] in stages["raw_crawl"]["zz-pii"]["text"]
    for stage in ("filtered", "deduplicated", "decontaminated"):
        text = stages[stage]["zz-pii"]["text"]
        for value, placeholder in PII.items():
            assert value not in text and placeholder in text, (stage, value)
    replaced = metadata(f"curation/{SOURCE}/filtered")["pii_replaced"]  # real pages add addresses of their own
    assert all(replaced.get(placeholder.strip("<>"), 0) >= 1 for placeholder in PII.values()), replaced

    # Every stage's checks ran and passed on these outputs.
    instance = DagsterInstance.get()
    for key, check in ((f"curation/{SOURCE}/filtered", "documents_valid"), ("curation/deduplicated", "documents_valid"),
                       (f"curation/{SOURCE}/decontaminated", "documents_valid"),
                       (f"curation/{SOURCE}/decontaminated", "no_benchmark_ngrams")):
        [record] = instance.event_log_storage.get_asset_check_execution_history(
            AssetCheckKey(AssetKey(key.split("/")), check), limit=1)
        assert record.status.value == "SUCCEEDED", (key, check)

    # The packed shards decode back to the decontaminated texts, the clean document's exactly as it came in.
    packed_dir = store / metadata(f"tokenization/{SOURCE}/packed")["prefix"]
    tokenizer = Tokenizer.from_file(str(next((store / metadata("tokenization/tokenizer")["prefix"]).glob("*.json"))))
    packing = PackingConfig(**recipe["packing"])
    splits = {"train": [], "val": []}
    for ordinal, doc in enumerate(stages["decontaminated"].values()):  # part order is the packing order
        splits["val" if is_val(doc["id"], ordinal, packing) else "train"].append(doc)
    decoded = {}
    for split, docs in splits.items():
        if not docs:  # a hashed split of ~30 documents may hold none (the reader refuses an empty split)
            continue
        shards = PackedSource(SOURCE, packed_dir, split)
        assert shards.documents == len(docs)
        for d, doc in enumerate(docs):
            tokens = shards.document(d)
            assert tokens[-1] == shards.eos_id and not np.any(tokens[:-1] == shards.eos_id)
            decoded[doc["id"]] = tokenizer.decode(tokens[:-1].tolist(), skip_special_tokens=False)
    assert decoded[CLEAN_ID] == clean
    assert decoded == {i: doc["text"] for i, doc in stages["decontaminated"].items()}
