"""Every asset's state, as `pretrain status` prints it and `pretrain materialize --stale` plans from it: fresh, stale
(with its root causes) or missing.

Dagster's stale-status resolver decides (CachingStaleStatusResolver: code versions, data versions, the observed
inputs); the instance is asked about all the assets at once beforehand, not once per asset as the resolver would
(assets/core/records.py), so the queries do not grow with the number of sources. A partitioned asset is missing if
any partition is, else stale if any is.
"""

from __future__ import annotations


def asset_states(instance, graph, keys: list, partition_rows: dict | None = None) -> list[tuple]:
    """[(key, "fresh" | "stale" | "missing", cause)] for `keys` of the asset graph `graph`, in their order. Given a
    `partition_rows` dict, fills it with {key: [(partition, state, cause)]} for the partitioned keys among those it
    already holds (a crawl's dumps: `pretrain status` shows each, `materialize --stale` runs only those not fresh)."""
    from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView, TemporalContext
    from dagster._core.definitions.data_version import CachingStaleStatusResolver
    from dagster._time import get_current_datetime

    from assets.core.factory import IN_ORDER
    from assets.core.records import BatchQueryer, latest_observations, prefetch_asset_records

    view = AssetGraphView(
        temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
        instance=instance,
        asset_graph=graph,
    )
    # The source assets' latest observations and the other assets' records, each in one query.
    observed = [key for key in graph.get_all_asset_keys()
                if graph.get(key).is_observable and not graph.get(key).is_materializable]
    queryer = BatchQueryer(instance, graph, view, latest_observations(instance, observed), observed)
    prefetch_asset_records(view, keys)
    resolver = CachingStaleStatusResolver(instance=instance, asset_graph=graph, loading_context=view,
                                          instance_queryer=queryer)
    rows = []
    for key in keys:
        node = graph.get(key)
        if not node.is_partitioned:
            state = resolver.get_status(key).value.lower()
            if state == "stale" and _kept(node) and \
                    all(_from_partitions(graph, c) for c in resolver.get_stale_root_causes(key)):
                state = "fresh"
            rows.append((key, state, _causes(resolver, key, [None], state)))
            continue
        # Dynamic partitions are read through the queryer, which asks once per partitions definition.
        partitions = sorted(node.partitions_def.get_partition_keys(dynamic_partitions_store=queryer))
        after = _built_after_earlier(queryer, key, partitions) if node.metadata.get(IN_ORDER) else {}
        per = []
        for p in partitions:
            state = resolver.get_status(key, p).value.lower()
            cause = _causes(resolver, key, [p], state)
            if p in after and state == "fresh":
                state, cause = "stale", f"dump {after[p]} before it was built again after it"
            per.append((p, state, cause))
        if partition_rows is not None and key in partition_rows:
            partition_rows[key] = per
        states = {state for _, state, _ in per} or {"missing"}
        state = next(s for s in ("missing", "stale", "fresh") if s in states)
        causes = sorted({cause for _, s, cause in per if s == state}) if state == "stale" else []
        rows.append((key, state, "; ".join(causes) if causes else _causes(resolver, key, partitions, state)))
    return rows


def _built_after_earlier(queryer, key, partitions: list[str]) -> dict[str, str]:
    """{partition: the earlier one built after it} of an asset whose partitions are built in order, each keyed on
    the ones before it (a crawl's deduplicated dumps: assets/curation/deduplicated.py). Dagster does not know that
    dependency; the order of the materializations does: one rebuilt before a later one makes that one stale."""
    records = queryer.partition_records(key)
    newest, newest_partition, stale = -1, None, {}
    for p in partitions:
        record = records.get(p)
        if record is None:
            continue
        if record.storage_id < newest:
            stale[p] = newest_partition
        elif record.storage_id > newest:
            newest, newest_partition = record.storage_id, p
    return stale


def _kept(node) -> bool:
    """An output kept whatever its code (the trained tokenizer: no code references in its code version)."""
    from assets.core.factory import CODE_METADATA

    refs = node.metadata.get(CODE_METADATA)
    return refs is not None and not getattr(refs, "value", refs)


def _from_partitions(graph, cause) -> bool:
    """A stale cause that is a partitioned asset's new or changed partition (a crawl's new dump): a kept output
    samples a crawl's first dump once and keeps it, so it is not stale for that (a recipe change still makes it so)."""
    def partitioned(key) -> bool:
        return key is not None and graph.has(key) and graph.get(key).is_partitioned

    return partitioned(cause.dependency_asset_key) or partitioned(cause.asset_key)


def _causes(resolver, key, partitions: list, state: str) -> str:
    if state == "missing":
        return "never materialized"
    if state == "stale":
        return "; ".join(sorted({_describe_cause(c, key) for p in partitions for c in resolver.get_stale_root_causes(key, p)}))
    return "-"


def _describe_cause(cause, key) -> str:
    reason = cause.reason
    if cause.asset_key != key:  # a root cause upstream: "curation/web/inputs has a new data version"
        reason = f"{cause.asset_key.to_user_string()} {reason}"
    if cause.dependency is not None:
        reason += f" ({cause.dependency.asset_key.to_user_string()})"
    return reason
