"""TrailboundHook: the one place Airflow code reaches trailbound's configuration and
metadata store. The connection is resolved lazily, never in __init__."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from airflow.sdk import BaseHook

from trailbound import config as configuration
from trailbound.metadata import MetadataStore


class TrailboundHook(BaseHook):
    """Reads the configuration file ($TRAILBOUND_CONFIG) and opens the metadata store
    through an Airflow connection (postgres), falling back to the environment variable
    the configuration names when the connection is not defined."""

    conn_name_attr = "trailbound_conn_id"
    default_conn_name = "trailbound_metadata"
    conn_type = "postgres"
    hook_name = "trailbound"

    def __init__(self, trailbound_conn_id: str = default_conn_name, config_path: str | None = None):
        super().__init__()
        self.trailbound_conn_id = trailbound_conn_id
        self.config_path = config_path
        self._config: configuration.Config | None = None

    @property
    def config(self) -> configuration.Config:
        if self._config is None:
            self._config = configuration.load(self.config_path or os.environ.get(configuration.CONFIG_ENV))
        return self._config

    def dsn(self) -> str:
        try:
            connection = self.get_connection(self.trailbound_conn_id)
        except Exception:  # not defined: the jobs' own variable, as the CLI uses it
            from trailbound.metadata import dsn_from_env

            return dsn_from_env(self.config.metadata.dsn_env)
        uri = connection.get_uri()
        return "postgresql://" + uri.split("://", 1)[1] if "://" in uri else uri

    @contextmanager
    def store(self) -> Iterator[MetadataStore]:
        store = MetadataStore.open(self.dsn())
        try:
            yield store
        finally:
            store.close()
