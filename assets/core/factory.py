"""The one reuse-or-build sequence behind every asset: `output_asset(OutputSpec(...))` makes the Dagster asset.

An asset states what it reads and how it builds; the factory does the rest, the same way for all of them:

    1. reads the declared upstream outputs (`reads`); one never materialized fails the step with a Failure that
       names the command making it (so does an OutputNotFound raised by `prepare`, `build` or the hooks);
    2. `prepare(inputs)` adds what else the version depends on: input file fingerprints, a slice of an upstream,
       and anything the build needs found once (a benchmark index);
    3. computes the version key (core/versioning.py) and reuses the output committed under it, if there is one;
    4. else builds: `build(inputs, out_dir)` writes the output's files into `out_dir` (a scratch folder of its
       own, `inputs.work` beside it for downloads and logs) and returns the manifest's own fields ("counts",
       "files", ...); the folder is committed with the manifest last, so a build that raises commits nothing
       and leaves its scratch folder for inspection (a `resumable` build continues in it next time);
    5. runs `checks(inputs, output)` on the committed output, read back from the store (a reused one as well);
    6. returns the data version, the output's location, `metadata(inputs, output)`, "version_key" and
       "data_version".

    raw_crawl = output_asset(OutputSpec(
        key=AssetKey(["curation", "web", "raw_crawl"]), group="curation", stage="raw_crawl",
        section=source.raw_section(), description="...",
        prepare=lambda inputs: inputs.but(fingerprints=file_fingerprints(files)),
        build=lambda inputs, out_dir: {"files": ..., "counts": {...}},
        metadata=lambda inputs, output: {"documents": output.manifest["counts"]["kept"]},
    ))

The code version is derived here from the stage, the code (the source text of the build's module and the engine
modules it imports, plus `code`: assets/core/source_hash.py) and the section, and the manifest records the sha256
of that same section, so the two cannot disagree. Nothing is bumped by hand: editing the code an output depends
on makes it stale, in the UI (Dagster compares code versions) and here (the version key changes).
"""


import dataclasses
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)

from assets.core.source_hash import code_digest
from assets.core.upstream import Output, OutputNotFound, committed_result, latest_output
from assets.core.versioning import code_version, manifest_header, version_key
from storage.manifest import commit_folder, read_manifest
from storage.objects import ObjectStore

# Every asset writes to the store and builds in scratch space; others (executor, launcher) are asked for by name.
BASE_RESOURCES = frozenset({"store", "scratch"})
CODE_METADATA = "pretrain/code"  # the asset definition's metadata: the code references of its code version
# An asset definition's metadata: its partitions run one at a time, in partition order (a crawl's dumps are each
# deduplicated against the ones before them; assets/runs/parallel.py schedules them so).
IN_ORDER = "pretrain/partitions_in_order"


@dataclass(frozen=True)
class Inputs:
    """What one materialization reads, as the hooks see it; `prepare` returns a changed copy (`but`)."""

    context: AssetExecutionContext
    store: ObjectStore
    outputs: dict[str, Output]  # the declared reads' latest committed outputs, by the spec's names
    upstream: dict[str, str] | None = None  # {asset: data version} for the manifest (None: the outputs')
    key_upstream: dict[str, str] | None = None  # for the version key, where it is not `upstream`
    fingerprints: list[str] | None = None  # what the version depends on from outside the recipe and the store
    manifest: dict = field(default_factory=dict)  # manifest fields known before the build ("inputs", "lineage")
    extra: dict = field(default_factory=dict)  # what prepare found for build, checks and metadata
    version_key: str = ""  # set before the build
    work: Path | None = None  # the build's scratch folder (set for `build` only)

    def but(self, **changes) -> "Inputs":
        return dataclasses.replace(self, **changes)

    def read(self, key: AssetKey) -> Output:
        """Another asset's latest committed output (OutputNotFound fails the step)."""
        return latest_output(self.context.instance, self.store, key)

    @property
    def resources(self):
        return self.context.resources

    @property
    def log(self):
        return self.context.log

    def upstream_versions(self) -> dict[str, str]:
        if self.upstream is not None:
            return self.upstream
        return {out.key.to_user_string(): out.data_version for out in self.outputs.values()}

    def key_versions(self) -> dict[str, str]:
        return self.key_upstream if self.key_upstream is not None else self.upstream_versions()


@dataclass(frozen=True)
class OutputSpec:
    """One asset: its key and recipe section, what it reads, and its hooks (see the module docstring)."""

    key: AssetKey
    group: str
    stage: str  # the code version's first field
    section: Any  # the recipe settings that decide the output (JSON-able)
    description: str
    build: Callable[[Inputs, Path], dict]
    metadata: Callable[[Inputs, Output], dict]
    reads: Mapping[str, AssetKey] = field(default_factory=dict)
    # Reads taken at this run's partition (a crawl's dump: filtered[2024-10] reads raw_crawl[2024-10]); the others
    # are read whole, as their latest output.
    same_partition: frozenset[str] = frozenset()
    deps: Sequence[AssetKey] = ()  # upstream assets read by the hooks themselves
    prepare: Callable[[Inputs], Inputs] | None = None
    checks: Callable[[Inputs, Output], list[AssetCheckResult]] | None = None
    check_specs: Sequence[AssetCheckSpec] = ()
    resources: frozenset[str] = frozenset()  # beyond store and scratch
    # Errors of these types from prepare or build fail the step with their message (bad input, not a bug).
    failures: tuple[type[Exception], ...] = ()
    # A stable scratch folder per version, kept after the commit (a retried training run finds its
    # checkpoints there); None: a fresh folder, removed once the output is committed.
    work_dir: Callable[[Inputs], Path] | None = None
    # Data stages on the executor: the scratch folder is the version's own (scratch/resume/<key>/<version>), so a
    # build killed half-way and materialized again finds the tasks that finished (the executor skips them);
    # removed once the output is committed.
    resumable: bool = False
    out_name: str = "out"  # the committed folder's name inside the scratch folder
    kinds: frozenset[str] = frozenset({"python"})
    asset_args: Mapping[str, Any] = field(default_factory=dict)  # partitions_def, retry_policy, config_schema, ...
    # The code the output depends on beyond the build's own module and the engine modules it imports
    # (assets/core/source_hash.py references: "trainer" for a stage that runs `python -m trainer`). None: no code
    # at all, for an output kept until the recipe or the user asks for a new one (the trained tokenizer).
    code: Sequence[str] | None = ()

    @property
    def code_refs(self) -> tuple[str, ...]:
        """Every code reference the code version hashes (empty for an output kept whatever its code)."""
        return () if self.code is None else (self.build.__module__, *self.code)

    @property
    def code_sha256(self) -> str | None:
        return code_digest(self.code_refs) if self.code_refs else None

    @property
    def code_version(self) -> str:
        return code_version(self.stage, self.code_sha256, self.section)


def output_asset(spec: OutputSpec):
    """The Dagster asset for `spec`."""
    deps = list(dict.fromkeys([*spec.reads.values(), *spec.deps]))

    @asset(
        key=spec.key,
        deps=deps,
        group_name=spec.group,
        code_version=spec.code_version,
        kinds=set(spec.kinds),
        check_specs=list(spec.check_specs),
        required_resource_keys=set(BASE_RESOURCES | spec.resources),
        description=spec.description,
        # What the code version hashes, so the UI shows why an edit made this asset stale.
        metadata={CODE_METADATA: MetadataValue.json(list(spec.code_refs)), **spec.asset_args.get("metadata", {})},
        **{name: value for name, value in spec.asset_args.items() if name != "metadata"},
    )
    def _output(context: AssetExecutionContext) -> MaterializeResult:
        return materialize(spec, context)

    return _output


def materialize(spec: OutputSpec, context: AssetExecutionContext) -> MaterializeResult:
    """Reuse or build the output of `spec` for this run, commit it, check it, and describe it."""
    store = context.resources.store.open()
    # A partition is an output of its own (the mix sweep's candidates): its folder is under the asset's.
    path = spec.key.path + ([context.partition_key] if context.has_partition_key else [])
    try:
        partition = context.partition_key if context.has_partition_key else None
        outputs = {name: latest_output(context.instance, store, key, partition if name in spec.same_partition else None)
                   for name, key in spec.reads.items()}
        inputs = Inputs(context=context, store=store, outputs=outputs)
        if spec.prepare is not None:
            inputs = spec.prepare(inputs)
        vkey = version_key(spec.code_version, upstream=inputs.key_versions(), inputs=inputs.fingerprints)
        inputs = inputs.but(version_key=vkey)
        prefix = "/".join(path + [vkey])
        manifest = read_manifest(store, prefix)
        if manifest is not None:
            context.log.info(f"{store.uri(prefix)} is already committed for this version; reusing it")
        else:
            manifest = _build_and_commit(spec, inputs, path, prefix)
        output = Output(spec.key, prefix, manifest)
        checks = spec.checks(inputs, output) if spec.checks is not None else []
        metadata = spec.metadata(inputs, output)
    except OutputNotFound as exc:
        raise Failure(description=str(exc)) from exc
    except spec.failures as exc:
        raise Failure(description=str(exc)) from exc
    return committed_result(store, prefix, manifest, check_results=checks,
                            metadata={**metadata, "version_key": vkey, "data_version": manifest["data_version"]})


def _build_and_commit(spec: OutputSpec, inputs: Inputs, path: list[str], prefix: str) -> dict:
    context = inputs.context
    if spec.work_dir is not None:
        work = spec.work_dir(inputs)
    elif spec.resumable:
        work = context.resources.scratch.version_dir("/".join(path), inputs.version_key)
        if work.exists():
            context.log.info(f"resuming the unfinished build of this version in {work}")
    else:
        work = context.resources.scratch.new_dir("/".join(path))
    out_dir = work / spec.out_name
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs = inputs.but(work=work)
    started = time.perf_counter()
    fields = spec.build(inputs, out_dir)
    # The build's own wall time, without Dagster's start-up or the checks (a stage may state a narrower one).
    fields.setdefault("seconds", round(time.perf_counter() - started, 3))
    manifest = commit_folder(inputs.store, prefix, out_dir, {
        **manifest_header(path, inputs.version_key, spec.code_version, spec.section, context.run.run_id),
        "upstream": inputs.upstream_versions(),
        **inputs.manifest,
        **fields,
    })
    if spec.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return manifest
