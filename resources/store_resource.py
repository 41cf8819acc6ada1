"""The Dagster resource around the `storage` package: where assets write their immutable outputs.

The store itself is the plain `storage` package so the engines can use it without Dagster; this wrapper only
carries its configuration. Credentials never appear here: boto3 reads them from the environment.
"""

from __future__ import annotations

from dagster import ConfigurableResource

from storage.objects import ObjectStore
from storage.factory import open_store


class StoreResource(ConfigurableResource):
    """A local folder (default, under PRETRAIN_HOME) or `s3://bucket/prefix` on any S3-compatible server."""

    url: str
    endpoint_url: str | None = None
    region: str | None = None

    def open(self) -> ObjectStore:
        if self.url.startswith("s3://"):
            return open_store(self.url, endpoint_url=self.endpoint_url, region=self.region)
        return open_store(self.url)
