"""The Dagster instance's records of many assets in a few queries, however many assets there are.

Dagster's stale-status resolver asks for one asset at a time: each asset's record is a query of its own (on SQLite a
connection of its own too, and two more to check the schema: 803 of them took 18 s of a 32 s `pretrain status` at
200 sources), and the latest observation of an observable source asset (curation/<source>/inputs) is two queries
more. Here they are fetched for every key at once:

    prefetch_asset_records(view, keys)     every asset record in one query, into the loading context the resolver
                                           reads (Dagster's own batch loader: AssetRecord.blocking_get_many)
    latest_observations(instance, keys)    {key: the latest AssetObservation record}, in two queries
    record_observations(instance, versions) an observation per key with its data version, written in one transaction
                                           per database (Dagster's SQLite storage opens an engine and commits twice
                                           per event: 1,000 sources' first observations took ~30 s on 2 cores)
    BatchQueryer(..., observations=...)    Dagster's CachingInstanceQueryer answering an observable's latest record
                                           from those, and a partitioned asset's latest materializations all at once

What the resolver decides does not change: the same records, fetched together, and the same rows written.
"""

from __future__ import annotations

import logging
from typing import Iterable, Mapping, Sequence

from dagster import AssetKey, DagsterEventType
from dagster._core.definitions.events import AssetKeyPartitionKey
from dagster._core.event_api import EventLogRecord, EventRecordsFilter
from dagster._utils.caching_instance_queryer import CachingInstanceQueryer

CHUNK = 500  # keys per IN (...) list: far below any database's limit on bound parameters


def prefetch_asset_records(loading_context, keys: Iterable[AssetKey]) -> None:
    """Load the asset records of `keys` into `loading_context`'s cache in one query (per CHUNK keys)."""
    from dagster._core.storage.event_log.base import AssetRecord

    keys = list(keys)
    for start in range(0, len(keys), CHUNK):
        AssetRecord.blocking_get_many(loading_context, keys[start:start + CHUNK])


def latest_observations(instance, keys: Sequence[AssetKey]) -> dict[AssetKey, EventLogRecord]:
    """The latest observation of each of `keys` that has one: the newest storage id per key in one grouped query (the
    event log's (asset_key, event type, id) index answers it), then those events in one more. An event log that is not
    SQL (none the project configures), or an asset wiped after its latest observation, is asked key by key."""
    from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

    storage = instance.event_log_storage
    if not isinstance(storage, SqlEventLogStorage):
        return _one_by_one(instance, keys)
    found: dict[AssetKey, EventLogRecord] = {}
    for start in range(0, len(keys), CHUNK):
        chunk = keys[start:start + CHUNK]
        ids = _latest_observation_ids(storage, chunk)
        if ids:
            records = storage.get_event_records(
                EventRecordsFilter(event_type=DagsterEventType.ASSET_OBSERVATION, storage_ids=ids), limit=len(ids))
            found.update({record.asset_key: record for record in records})
        wiped = _wiped_after(storage, [key for key in chunk if key in found], found)
        for key in wiped:
            del found[key]
        found.update(_one_by_one(instance, wiped))
    return found


def _latest_observation_ids(storage, keys: Sequence[AssetKey]) -> list[int]:
    import sqlalchemy as db
    from dagster._core.storage.event_log.schema import SqlEventLogStorageTable as events
    from dagster._core.storage.sqlalchemy_compat import db_fetch_mappings, db_select

    query = (db_select([events.c.asset_key, db.func.max(events.c.id).label("id")])
             .where(events.c.asset_key.in_([key.to_string() for key in keys]))
             .where(events.c.dagster_event_type == DagsterEventType.ASSET_OBSERVATION.value)
             .group_by(events.c.asset_key))
    with storage.index_connection() as conn:
        return [row["id"] for row in db_fetch_mappings(conn, query)]


def _wiped_after(storage, keys: Sequence[AssetKey], found: Mapping[AssetKey, EventLogRecord]) -> list[AssetKey]:
    """The keys whose asset was wiped after the observation found (Dagster's own queries leave those out)."""
    if not keys:
        return []
    details = storage._get_assets_details(list(keys))  # noqa: SLF001  (one query; what fetch_observations reads)
    return [key for key, detail in zip(keys, details)
            if detail is not None and detail.last_wipe_timestamp
            and found[key].timestamp <= detail.last_wipe_timestamp]


def _one_by_one(instance, keys: Iterable[AssetKey]) -> dict[AssetKey, EventLogRecord]:
    found = {}
    for key in keys:
        records = instance.fetch_observations(key, limit=1).records
        if records:
            found[key] = records[0]
    return found


class BatchQueryer(CachingInstanceQueryer):
    """Dagster's queryer, told the latest observation of the observable source assets up front (`latest_observations`;
    a source asset is never materialized, so its latest observation is its latest record), and asking for the latest
    materialization of every partition of an asset at once (two queries, where Dagster asks once a partition). The
    resolver's questions are then answered from those; cursors go to Dagster's own code."""

    def __init__(self, instance, asset_graph, loading_context, observations: Mapping[AssetKey, EventLogRecord],
                 observed: Iterable[AssetKey]):
        super().__init__(instance, asset_graph, loading_context)
        self._observations = dict(observations)
        self._observed = frozenset(observed)  # the keys `observations` was asked for: a missing one has none
        self._by_partition: dict[AssetKey, dict[str, EventLogRecord]] = {}

    def get_latest_materialization_or_observation_record(self, asset_partition: AssetKeyPartitionKey,
                                                         after_cursor: int | None = None,
                                                         before_cursor: int | None = None) -> EventLogRecord | None:
        key, partition = asset_partition.asset_key, asset_partition.partition_key
        if after_cursor is None and before_cursor is None:
            if key in self._observed and partition is None:
                return self._observations.get(key)
            if partition is not None and self.asset_graph.has(key):
                node = self.asset_graph.get(key)
                if node.is_materializable and not node.is_observable:
                    return self.partition_records(key).get(partition)
        return super().get_latest_materialization_or_observation_record(asset_partition, after_cursor, before_cursor)

    def partition_records(self, key: AssetKey) -> dict[str, EventLogRecord]:
        """{partition: its latest materialization} of `key`, asked once."""
        if key not in self._by_partition:
            self._by_partition[key] = partition_materializations(self.instance, key)
        return self._by_partition[key]


def partition_materializations(instance, key: AssetKey) -> dict[str, EventLogRecord]:
    """{partition: its latest materialization} of `key`: the newest storage id of each partition in one query
    (Dagster's own, which leaves out what a wipe removed), those events in one more (per CHUNK partitions)."""
    ids = list(instance.get_latest_storage_id_by_partition(key, event_type=DagsterEventType.ASSET_MATERIALIZATION)
               .values())
    records: dict[str, EventLogRecord] = {}
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start:start + CHUNK]
        for record in instance.event_log_storage.get_event_records(EventRecordsFilter(
                event_type=DagsterEventType.ASSET_MATERIALIZATION, asset_key=key, storage_ids=chunk),
                limit=len(chunk)):
            records[record.partition_key] = record
    return records


def record_observations(instance, versions: Mapping[AssetKey, str]) -> None:
    """Record an observation of each key with its data version (user-provided), the event `report_runless_asset_event`
    records, in one transaction per database: on SQLite the same rows its store_event writes (the runless run's shard,
    then the index shard's event, tags and asset record), without an engine and two commits per event. Another event
    log (PostgreSQL, pooled connections) is given the events one by one through the instance."""
    from dagster import AssetObservation
    from dagster._core.definitions.data_version import DATA_VERSION_IS_USER_PROVIDED_TAG, DATA_VERSION_TAG
    from dagster._core.events import AssetObservationData, DagsterEvent
    from dagster._core.events.log import EventLogEntry
    from dagster._core.instance.utils import RUNLESS_JOB_NAME, RUNLESS_RUN_ID
    from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
    from dagster._time import get_current_timestamp

    entries = [EventLogEntry(
        user_message="", level=logging.INFO, job_name=RUNLESS_JOB_NAME, run_id=RUNLESS_RUN_ID, error_info=None,
        timestamp=get_current_timestamp(), step_key=None,
        dagster_event=DagsterEvent(
            event_type_value=DagsterEventType.ASSET_OBSERVATION.value, job_name=RUNLESS_JOB_NAME,
            event_specific_data=AssetObservationData(AssetObservation(
                asset_key=key, tags={DATA_VERSION_TAG: version, DATA_VERSION_IS_USER_PROVIDED_TAG: "true"}))))
        for key, version in versions.items()]
    storage = instance.event_log_storage
    if type(storage) is not SqliteEventLogStorage:  # a subclass may store otherwise: let it
        for entry in entries:
            instance.handle_new_event(entry)
        return
    for start in range(0, len(entries), CHUNK):
        chunk = entries[start:start + CHUNK]
        with storage.run_connection(RUNLESS_RUN_ID) as conn:
            for entry in chunk:
                conn.execute(storage.prepare_insert_event(entry))
        with storage.index_transaction() as conn:
            ids = [conn.execute(storage.prepare_insert_event(entry)).inserted_primary_key[0] for entry in chunk]
            storage._store_asset_event_tags(conn, chunk, ids)  # noqa: SLF001  (what store_event calls)
            for entry, event_id in zip(chunk, ids):
                storage._store_asset_event(conn, entry, event_id)  # noqa: SLF001
