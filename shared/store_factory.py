"""Opens the configured store backend from Settings, so processes never construct backends by hand.

Every store call has a deadline consistent with the failover time (`store_call_timeout_millis`): the DynamoDB
client's connect and read timeouts, SQLite's busy wait, PostgreSQL's connect, statement and TCP timeouts.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from shardherd.shared.aws import make_client
from shardherd.shared.config import Settings
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.store import LeaseStore
from shardherd.shared.store_meter import StoreMeter

_meters = itertools.count()  # tells apart the reports of stores opened in one process (two agents, a coordinator)
SQL_IDLE_CONNECTIONS = 2  # connections an SQL store keeps open between calls, outside the coordinator


def open_store(settings: Settings, retry: RetryPolicy | None = None, caller: str = "other") -> LeaseStore:
    """The DynamoDB or SQL store named by `settings.store_backend`, on the application's tables.

    With `store_meter_dir` set the store is wrapped in a StoreMeter whose report (calls outside any `acting_as`
    block count under `caller`) is written to `<dir>/<caller>-<pid>-<n>.json` every few seconds and at close (`n`
    numbers the process's metered stores: two agents in one process would otherwise overwrite each other's report).
    """
    store = _open_backend(settings, retry, caller)
    if settings.store_meter_dir is None:
        return store
    path = Path(settings.store_meter_dir) / f"{caller}-{os.getpid()}-{next(_meters)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return StoreMeter(store, consistent_reads=settings.consistent_reads or settings.store_backend == "sql",
                      default_caller=caller, dump_path=path)


def call_timeouts(deadline: float) -> tuple[float, float]:
    """Connect and read timeouts (seconds) of the DynamoDB client: half of one call's deadline, and all of it.

    A call that hangs (a blackholed endpoint drops the SYN, or the connection's answer never comes) then fails within
    `deadline` instead of botocore's 5 s connect or 30 s read timeout, well inside the failover time
    (Settings.effective_store_call_timeout_millis).
    """
    return deadline / 2, deadline


def _open_backend(settings: Settings, retry: RetryPolicy | None, caller: str) -> LeaseStore:
    if settings.store_backend == "dynamodb":
        from shardherd.shared.dynamo.store import DynamoLeaseStore

        client = make_client("dynamodb", settings.region, settings.dynamodb_endpoint_url,
                             timeouts=call_timeouts(settings.effective_store_call_timeout_millis / 1000))
        return DynamoLeaseStore(
            client,
            settings.table_names,
            retry=retry,
            billing_mode=settings.billing_mode,
            read_capacity=settings.initial_lease_table_read_capacity,
            write_capacity=settings.initial_lease_table_write_capacity,
            consistent_reads=settings.consistent_reads,
        )
    from shardherd.shared.sql.store import SqlLeaseStore

    # The coordinator keeps its pool open (the leader writes with leader_write_threads at once, every run); any other
    # process keeps SQL_IDLE_CONNECTIONS. Each held 10 idle connections before: 34 agents of the scale run
    # (bench/scale.py) exhausted PostgreSQL's max_connections (200 there, 100 by default), and the Spark agents could
    # not heartbeat.
    idle = None if caller == "coordinator" else SQL_IDLE_CONNECTIONS
    return SqlLeaseStore(settings.sql_url.get_secret_value(), settings.table_names, retry=retry,
                         call_timeout=settings.effective_store_call_timeout_millis / 1000, idle=idle,
                         name=f"shardherd-{caller}")
