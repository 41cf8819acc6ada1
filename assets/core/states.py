"""Every asset's state, as `pretrain status` prints it and `pretrain materialize --stale` plans from it: fresh, stale
(with its root causes) or missing.

Dagster's stale-status resolver decides (CachingStaleStatusResolver: code versions, data versions, the observed
inputs); the instance is asked about all the assets at once beforehand, not once per asset as the resolver would
(assets/core/records.py), so the queries do not grow with the number of sources. A partitioned asset is missing if
any partition is, else stale if any is.
"""

from __future__ import annotations


def asset_states(instance, graph, keys: list) -> list[tuple]:
    """[(key, "fresh" | "stale" | "missing", cause)] for `keys` of the asset graph `graph`, in their order."""
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
        if state == "missing":
            cause = "never materialized"
        elif state == "stale":
            causes = {_describe_cause(c, key) for p in partitions for c in resolver.get_stale_root_causes(key, p)}
            cause = "; ".join(sorted(causes))
        else:
            cause = "-"
        rows.append((key, state, cause))
    return rows


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
