"""assets/curation/decontaminated.py: the OutputSpec for the demo recipe (key, reads, section, checks, failures),
benchmark_files, and prepare/build run directly on a tiny committed dedup output and a one-line benchmark."""

import dataclasses
import gzip
import hashlib
import json
import logging
from types import SimpleNamespace

import pytest
from dagster import AssetKey

import assets.curation.decontaminated as decontaminated
from assets.core.factory import Inputs
from assets.core.upstream import Output
from assets.core.source_hash import code_parts
from assets.core.versioning import code_version
from assets.recipe import DEMO_RECIPE, Recipe, load_recipe
from resources.executor import ExecutorResource
from resources.scratch import ScratchResource
from storage.local import LocalStore
from storage.manifest import commit_folder, data_version_of

BENCHMARK = "the quick brown fox jumps over the lazy dog near the river bank"


def spec_of(monkeypatch, recipe, source):
    monkeypatch.setattr(decontaminated, "output_asset", lambda spec: spec)
    return decontaminated.decontaminated_asset(recipe, source)


def test_demo_spec(monkeypatch):
    recipe = load_recipe(DEMO_RECIPE)
    spec = spec_of(monkeypatch, recipe, recipe.source("code"))
    assert spec.key == AssetKey(["curation", "code", "decontaminated"]) == decontaminated.decontaminated_key("code")
    assert (spec.group, spec.stage) == ("curation", "decontaminated")
    assert dict(spec.reads) == {"documents": AssetKey(["curation", "deduplicated"])}
    assert spec.section == {"source": "code", "decontamination": dataclasses.asdict(recipe.decontamination)}
    assert spec.section["decontamination"]["ngram"] == 13 and spec.section["decontamination"]["action"] == "drop"
    assert spec.code_version == code_version("decontaminated", spec.code_sha256, spec.section)
    # The code version follows the engine code it runs: the index, the benchmark items and the tasks.
    assert {"pipelines.decontam.index", "pipelines.decontam.items", "pipelines.decontam.steps"} <= set(code_parts(spec.code_refs))
    assert spec.resources == frozenset({"executor"}) and spec.resumable
    assert [(c.asset_key, c.name, c.blocking) for c in spec.check_specs] == [
        (spec.key, "documents_valid", False), (spec.key, "no_benchmark_ngrams", True)]
    assert spec.failures == (ValueError,)
    assert len(decontaminated.benchmark_files(recipe)) == len(recipe.decontamination.benchmarks) == 17


def recipe_in(tmp_path, benchmarks, ngram=5):
    (tmp_path / "docs.jsonl").write_text("{}\n")
    return Recipe.model_validate({"name": "tiny", "path": tmp_path / "recipe.yaml",
                                  "sources": [{"name": "web", "format": "jsonl", "inputs": ["docs.jsonl"]},
                                              {"name": "code", "format": "jsonl", "inputs": ["docs.jsonl"]}],
                                  "decontamination": {"benchmarks": benchmarks, "ngram": ngram}})


def test_benchmark_files_none_found_and_missing(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "a.txt").write_text(BENCHMARK)
    (tmp_path / "bench" / "b.jsonl").write_text("{}")
    assert decontaminated.benchmark_files(recipe_in(tmp_path, [])) == []
    assert decontaminated.benchmark_files(recipe_in(tmp_path, ["bench/*"])) == [
        tmp_path / "bench" / "a.txt", tmp_path / "bench" / "b.jsonl"]
    with pytest.raises(ValueError, match=r"recipe 'tiny': decontamination.benchmarks: .*missing.txt"):
        decontaminated.benchmark_files(recipe_in(tmp_path, ["bench/missing.txt"]))


def committed_dedup(store, tmp_path, web_docs, code_docs, name="dedup"):
    folder = tmp_path / name
    for source, docs in (("web", web_docs), ("code", code_docs)):
        (folder / source).mkdir(parents=True)
        lines = "".join(json.dumps({"text": t, "id": f"{source}-{i}", "metadata": {}}) + "\n" for i, t in enumerate(docs))
        # mtime=0: the same documents give the same bytes (and data version) whichever second they were written in
        (folder / source / "part-00000.jsonl.gz").write_bytes(gzip.compress(lines.encode(), mtime=0))
    manifest = commit_folder(store, f"curation/deduplicated/{name}", folder, {})
    return Output(AssetKey(["curation", "deduplicated"]), f"curation/deduplicated/{name}", manifest)


def test_prepare_keys_on_its_own_slice_and_build_drops_the_contaminated_document(monkeypatch, tmp_path):
    (tmp_path / "bench.txt").write_text(BENCHMARK + "\n")
    recipe = recipe_in(tmp_path, ["bench.txt"])
    spec = spec_of(monkeypatch, recipe, recipe.source("web"))
    store = LocalStore(tmp_path / "store")
    web = ["A clean document about gardening in the spring.",
           f"Leaked: {BENCHMARK} and more words after it."]
    dedup = committed_dedup(store, tmp_path, web, ["def f(): pass"])
    context = SimpleNamespace(log=logging.getLogger("test"),
                              resources=SimpleNamespace(scratch=ScratchResource(root=str(tmp_path / "work")),
                                                        executor=ExecutorResource(kind="local", workers=1)))
    inputs = spec.prepare(Inputs(context=context, store=store, outputs={"documents": dedup}))
    own = [f for f in dedup.manifest["files"] if f["path"].startswith("web/")]
    assert inputs.key_upstream == {"curation/deduplicated[web]": data_version_of(own)}
    bench = tmp_path / "bench.txt"
    assert inputs.fingerprints == [f"bench.txt:{bench.stat().st_size}:sha256:{hashlib.sha256(bench.read_bytes()).hexdigest()}"]
    assert inputs.manifest == {"inputs": [str(tmp_path / "bench.txt")]}
    # Another source's documents changed: this source's key input is the same.
    other = committed_dedup(store, tmp_path, web, ["def g(): return 1"], name="dedup2")
    assert other.data_version != dedup.data_version
    assert spec.prepare(Inputs(context=context, store=store, outputs={"documents": other})).key_upstream == inputs.key_upstream
    # The index was cached under the scratch root, once.
    assert len(list((tmp_path / "work" / "decontam-index").glob("*.index"))) == 1

    work = tmp_path / "build"
    (work / "out").mkdir(parents=True)
    fields = spec.build(inputs.but(work=work), work / "out")
    counts = fields["counts"]
    assert (counts["in"], counts["kept"], counts["dropped"], counts["cut"]) == (2, 1, {"contaminated": 1}, 0)
    assert counts["hits"] == {"bench": 1}
    assert counts["benchmark_ngrams"] == len(BENCHMARK.split()) - 5 + 1  # every 5-gram of the one line
    kept = [json.loads(line)["text"] for part in sorted((work / "out").glob("part-*.jsonl.gz"))
            for line in gzip.decompress(part.read_bytes()).splitlines()]
    assert kept == [web[0]]
    # Named after the input part; the counts come from the scan's stats, the records from the files.
    assert fields["files"] == [{"path": "decontamination_report.jsonl", "records": 1},
                               {"path": "part-00000.jsonl.gz", "records": 1}, {"path": "removed-00000.jsonl.gz", "records": 1}]
    assert (work / "logs" / "decontaminate" / "stats.json").is_file()
    # The report, committed with the parts, names the benchmark, the item (the file's line) and the matched text.
    (hit,) = [json.loads(line) for line in (work / "out" / "decontamination_report.jsonl").read_text().splitlines()]
    assert {k: hit[k] for k in ("part", "id", "action", "benchmark", "item", "span")} == {
        "part": "part-00000.jsonl.gz", "id": "web-1", "action": "dropped", "benchmark": "bench", "item": "line=1",
        "span": BENCHMARK}
    assert fields["report"] == {"path": "decontamination_report.jsonl", "hits": 1, "hits_per_benchmark": {"bench": 1},
                                "first": [hit]}
    # The asset's metadata: where the report is, hits per benchmark, and the first hits as a table.
    manifest = commit_folder(store, "curation/web/decontaminated/v", work / "out", dict(fields))
    metadata = spec.metadata(inputs, Output(spec.key, "curation/web/decontaminated/v", manifest))
    assert metadata["report"].path == store.uri("curation/web/decontaminated/v/decontamination_report.jsonl")
    assert metadata["report_hits"] == 1 and metadata["report_hits_per_benchmark"].data == {"bench": 1}
    assert "| bench | line=1 | web-1 | dropped | the quick brown fox" in metadata["report_first_hits"].md_str
    assert store.exists("curation/web/decontaminated/v/decontamination_report.jsonl")


@pytest.mark.parametrize("module, before, after", [
    ("pipelines/decontam/index.py", "SHARD_COMPRESSLEVEL = 1", "SHARD_COMPRESSLEVEL = 2"),
    ("pipelines/decontam/items.py", "def benchmark_items(", "def benchmark_items(  "),
    ("pipelines/dedup/minhash.py", "def normalized_words(", "def normalized_words(  "),
])
def test_the_benchmark_index_cache_key_covers_the_code_that_builds_it(tmp_path, module, before, after):
    """The built index is kept in the scratch folder and reused by key: the key changes with the code of the index,
    the benchmark items it reads and the word normalization it hashes, not only with the hand-bumped INDEX_FORMAT."""
    import shutil

    from assets.core.source_hash import code_digest
    from tests.conftest import REPO

    edited = tmp_path / "edited"
    shutil.copytree(REPO / "pipelines", edited / "pipelines", ignore=shutil.ignore_patterns("__pycache__"))
    path = edited / module
    assert path.read_text().count(before) == 1, before
    path.write_text(path.read_text().replace(before, after))
    assert code_digest(decontaminated.INDEX_CODE, edited) != code_digest(decontaminated.INDEX_CODE, REPO)
