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
        # Dynamic partitions are read through the queryer, which asks once per partitions definition.
        partitions = (node.partitions_def.get_partition_keys(dynamic_partitions_store=queryer)
                      if node.is_partitioned else [None])
        state = _state(resolver, key, partitions, node.is_partitioned)
        if partition_rows is not None and key in partition_rows and node.is_partitioned:
            partition_rows[key] = [(p, s := resolver.get_status(key, p).value.lower(), _causes(resolver, key, [p], s))
                                   for p in sorted(partitions)]
        if state == "stale" and not node.is_partitioned and _kept(node) and \
                all(_from_partitions(graph, c) for c in resolver.get_stale_root_causes(key)):
            state = "fresh"
        rows.append((key, state, _causes(resolver, key, partitions, state)))
    return rows


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


def _state(resolver, key, partitions: list, partitioned: bool) -> str:
    if not partitioned:
        return resolver.get_status(key).value.lower()
    states = {resolver.get_status(key, partition).value.lower() for partition in partitions} or {"missing"}
    return next(state for state in ("missing", "stale", "fresh") if state in states)


def _describe_cause(cause, key) -> str:
    reason = cause.reason
    if cause.asset_key != key:  # a root cause upstream: "curation/web/inputs has a new data version"
        reason = f"{cause.asset_key.to_user_string()} {reason}"
    if cause.dependency is not None:
        reason += f" ({cause.dependency.asset_key.to_user_string()})"
    return reason
