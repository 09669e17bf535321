"""Store throughput on loopback: renew, assign, checkpoint, full scan and owner-index query, per backend.

Each figure is set against a bare call of the same kind made in the same run on the same table (an unconditional
boto3 UpdateItem / Scan / Query, or a plain SQL UPDATE / SELECT), so the cost of the store's conditions, reads and
decoding shows as a ratio. Single-threaded and sequential: these are latency-bound operations per second. The CPU
milliseconds each call costs this process are printed too: what 32 agents checkpointing on one host pay for.

    python -m bench.store_ops --leases 10000 --ops 300          # the full run
    python -m bench.store_ops --leases 500 --ops 50 --backends sqlite   # a quick look
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, MetaData, Table, create_engine, event, select, update

from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.lease import Lease
from shardherd.shared.store import LEASE_OWNER_INDEX, LeaseStore, TableNames
from tests.support.postgres import PostgresServer

BACKENDS = ("dynamodb", "sqlite", "postgres")
OWNERS = 10  # seeded leases are spread over this many owners; the owner query returns leases / OWNERS keys
APPLICATION = "bench-store-ops"


@dataclass(frozen=True)
class Figure:
    """One measured operation: store and bare rates (per second) of `unit`, and this process's CPU ms per call."""

    backend: str
    operation: str
    unit: str
    store: Timed
    bare: Timed

    @property
    def store_rate(self) -> float:
        """Store calls per second."""
        return self.store.rate

    @property
    def bare_rate(self) -> float:
        """Bare calls per second."""
        return self.bare.rate

    @property
    def ratio(self) -> float:
        """How many times slower the store call is than the bare call."""
        return self.bare_rate / self.store_rate


WARM_UP = 3  # untimed calls first: connection set-up, lazily loaded botocore models, cold caches


@dataclass(frozen=True)
class Timed:
    """Calls per second, and this process's CPU milliseconds per call."""

    rate: float
    cpu_ms: float


def rate(count: int, action: Callable[[int], object]) -> Timed:
    """`action(i)` for i in range(WARM_UP, WARM_UP + count), sequentially, after a warm-up: calls/s, CPU ms per call."""
    for index in range(WARM_UP):
        action(index)
    started, cpu = time.perf_counter(), time.process_time()
    for index in range(WARM_UP, WARM_UP + count):
        action(index)
    return Timed(count / (time.perf_counter() - started), (time.process_time() - cpu) * 1000 / count)


class Bare:
    """The baseline calls of one backend, made without the store, on the store's tables."""

    def update_counter(self, key: str) -> None:
        """Unconditional counter increment (what a renew does at least)."""
        raise NotImplementedError

    def update_owner(self, key: str, owner: str) -> None:
        """Unconditional owner change and counter increment (what an assign does at least)."""
        raise NotImplementedError

    def update_checkpoint(self, key: str, checkpoint: Checkpoint) -> None:
        """Unconditional checkpoint write and counter increment (what a checkpoint does at least)."""
        raise NotImplementedError

    def scan(self, page_size: int) -> int:
        """Read every lease row; the number of rows."""
        raise NotImplementedError

    def owned(self, owner: str) -> int:
        """Keys owned by `owner` via the owner index; the number of keys."""
        raise NotImplementedError


class BareDynamo(Bare):
    """Bare boto3 calls."""

    def __init__(self, client: Any, table: str) -> None:
        self._client = client
        self._table = table

    def _update(self, key: str, expression: str, values: dict[str, Any]) -> None:
        self._client.update_item(TableName=self._table, Key={"leaseKey": {"S": key}}, UpdateExpression=expression,
                                 ExpressionAttributeValues={":one": {"N": "1"}, **values})

    def update_counter(self, key: str) -> None:
        """UpdateItem ADD leaseCounter 1."""
        self._update(key, "ADD leaseCounter :one", {})

    def update_owner(self, key: str, owner: str) -> None:
        """UpdateItem SET leaseOwner, ADD leaseCounter."""
        self._update(key, "SET leaseOwner = :o ADD leaseCounter :one", {":o": {"S": owner}})

    def update_checkpoint(self, key: str, checkpoint: Checkpoint) -> None:
        """UpdateItem SET checkpoint fields, ADD leaseCounter."""
        self._update(key, "SET checkpoint = :c, checkpointSubSequenceNumber = :s, ownerSwitchesSinceCheckpoint = :z"
                     " ADD leaseCounter :one",
                     {":c": {"S": checkpoint.sequence_number}, ":s": {"N": str(checkpoint.sub_sequence_number)},
                      ":z": {"N": "0"}})

    def scan(self, page_size: int) -> int:
        """Paginated Scan."""
        pages = self._client.get_paginator("scan").paginate(TableName=self._table, Limit=page_size)
        return sum(len(page["Items"]) for page in pages)

    def owned(self, owner: str) -> int:
        """Paginated Query on the KEYS_ONLY GSI."""
        pages = self._client.get_paginator("query").paginate(
            TableName=self._table, IndexName=LEASE_OWNER_INDEX, KeyConditionExpression="leaseOwner = :o",
            ExpressionAttributeValues={":o": {"S": owner}})
        return sum(len(page["Items"]) for page in pages)


class BareSql(Bare):
    """Bare SQLAlchemy Core statements, one transaction each."""

    def __init__(self, engine: Engine, table: str) -> None:
        self._engine = engine
        self._leases = Table(table, MetaData(), autoload_with=engine)

    def _update(self, key: str, **values: Any) -> None:
        leases = self._leases
        with self._engine.begin() as connection:
            connection.execute(update(leases).where(leases.c.lease_key == key)
                               .values(lease_counter=leases.c.lease_counter + 1, **values))

    def update_counter(self, key: str) -> None:
        """UPDATE ... SET lease_counter = lease_counter + 1."""
        self._update(key)

    def update_owner(self, key: str, owner: str) -> None:
        """UPDATE ... SET lease_owner, lease_counter + 1."""
        self._update(key, lease_owner=owner)

    def update_checkpoint(self, key: str, checkpoint: Checkpoint) -> None:
        """UPDATE ... SET checkpoint columns, lease_counter + 1."""
        self._update(key, checkpoint=checkpoint.sequence_number,
                     checkpoint_sub_sequence_number=checkpoint.sub_sequence_number,
                     owner_switches_since_checkpoint=0)

    def scan(self, page_size: int) -> int:
        """SELECT * (all rows, fetched in one go)."""
        with self._engine.connect() as connection:
            return len(connection.execute(select(self._leases)).all())

    def owned(self, owner: str) -> int:
        """SELECT lease_key WHERE lease_owner = owner (the B-tree owner index)."""
        leases = self._leases
        with self._engine.connect() as connection:
            return len(connection.execute(select(leases.c.lease_key).where(leases.c.lease_owner == owner)).all())


def _sqlite_pragmas(connection: sqlite3.Connection, _record: object) -> None:
    """The same durability settings the store's SQLite engine uses, so the baseline is comparable."""
    connection.execute("PRAGMA synchronous=NORMAL")


@contextmanager
def opened(backend: str, tables: TableNames) -> Iterator[tuple[LeaseStore, Bare]]:
    """The store and the bare baseline of `backend`, on servers started here and stopped at the end."""
    with ExitStack() as stack:
        if backend == "dynamodb":
            from shardherd.shared.dynamo.store import DynamoLeaseStore

            server = stack.enter_context(MotoServer())
            client = make_client("dynamodb", "us-east-1", server.endpoint_url)
            store: LeaseStore = DynamoLeaseStore(client, tables)
            store.ensure_tables()
            yield store, BareDynamo(make_client("dynamodb", "us-east-1", server.endpoint_url), tables.leases)
            return
        from shardherd.shared.sql.store import SqlLeaseStore

        if backend == "sqlite":
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="shardherd-bench-"))
            url = f"sqlite:///{Path(directory) / 'leases.db'}"
        else:
            postgres = PostgresServer().start()
            stack.callback(postgres.stop)
            url = postgres.url
        store = SqlLeaseStore(url, tables)
        stack.callback(store.close)
        store.ensure_tables()
        engine = create_engine(url)
        if backend == "sqlite":
            event.listen(engine, "connect", _sqlite_pragmas)
        stack.callback(engine.dispose)
        yield store, BareSql(engine, tables.leases)


def seed(store: LeaseStore, count: int, threads: int) -> float:
    """Create `count` leases spread over OWNERS owners; creations per second (with `threads` in parallel)."""
    def create(index: int) -> None:
        lease = Lease(lease_key=f"shardId-{index:012d}", lease_owner=f"worker-{index % OWNERS}",
                      checkpoint=Checkpoint.at(49_000_000_000_000_000_000 + index))
        if not store.create_lease(lease).applied:
            raise RuntimeError(f"seeding failed at {lease.lease_key}")

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, range(count)))
    return count / (time.perf_counter() - started)


def measure(backend: str, leases: int, ops: int, scans: int, queries: int, page_size: int,
            seed_threads: int) -> list[Figure]:
    """Every figure of one backend."""
    tables = TableNames.for_application(APPLICATION)
    with opened(backend, tables) as (store, bare):
        created = seed(store, leases, seed_threads)
        print(f"  {backend}: seeded {leases} leases at {created:,.0f} creates/s ({seed_threads} threads)", flush=True)
        renew_key, assign_key, checkpoint_key, bare_key = (f"shardId-{index:012d}" for index in range(4))
        figures = []

        renewed = store.get_lease(renew_key)
        assert renewed is not None
        counter = [renewed.lease_counter]  # the renewer's last seen counter
        owner = ["worker-1"]  # the assigned lease's current owner

        def renew(_: int) -> None:
            outcome = store.renew(renew_key, "worker-0", counter[0])
            assert outcome.applied and outcome.lease is not None
            counter[0] = outcome.lease.lease_counter

        def assign(index: int) -> None:
            new = f"worker-{index % 2 + 2}"
            assert store.assign(assign_key, new, owner[0], None).applied
            owner[0] = new

        def checkpoint(index: int) -> None:
            assert store.checkpoint(checkpoint_key, "worker-2", Checkpoint.at(10**60 + index)).applied

        figures.append(Figure(backend, "renew", "ops", rate(ops, renew),
                              rate(ops, lambda _: bare.update_counter(bare_key))))
        figures.append(Figure(backend, "assign", "ops", rate(ops, assign),
                              rate(ops, lambda index: bare.update_owner(bare_key, f"worker-{index % 2 + 2}"))))
        figures.append(Figure(backend, "checkpoint", "ops", rate(ops, checkpoint),
                              rate(ops, lambda index: bare.update_checkpoint(bare_key, Checkpoint.at(10**60 + index)))))

        def scan(_: int) -> None:
            result = store.scan_leases(page_size=page_size)
            assert len(result.leases) == leases and not result.malformed

        def bare_scan(_: int) -> None:
            assert bare.scan(page_size) == leases

        figures.append(Figure(backend, f"scan {leases} leases", "scans", rate(scans, scan), rate(scans, bare_scan)))

        expected = len(range(5, leases, OWNERS))

        def query(_: int) -> None:
            assert len(store.list_owned_keys("worker-5")) == expected

        def bare_query(_: int) -> None:
            assert bare.owned("worker-5") == expected

        figures.append(Figure(backend, f"owner query ({expected} keys)", "queries", rate(queries, query),
                              rate(queries, bare_query)))
        return figures


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print one table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated subset of " + ", ".join(BACKENDS))
    parser.add_argument("--leases", type=int, default=10_000, help="leases in the table (scanned and queried)")
    parser.add_argument("--ops", type=int, default=300, help="renew / assign / checkpoint calls each")
    parser.add_argument("--scans", type=int, default=3, help="full scans")
    parser.add_argument("--queries", type=int, default=30, help="owner-index queries")
    parser.add_argument("--page-size", type=int, default=1000, help="scan page size")
    parser.add_argument("--seed-threads", type=int, default=8, help="threads creating the leases")
    args = parser.parse_args(argv)
    backends = [name.strip() for name in args.backends.split(",") if name.strip()]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown or args.leases < OWNERS or min(args.ops, args.scans, args.queries, args.page_size) < 1:
        parser.error(f"unknown backends {unknown}" if unknown else f"--leases must be >= {OWNERS}, counts >= 1")
    figures: list[Figure] = []
    for backend in backends:
        figures.extend(measure(backend, args.leases, args.ops, args.scans, args.queries, args.page_size,
                               args.seed_threads))
    print(f"\n{'backend':<10} {'operation':<26} {'store/s':>9} {'bare/s':>9} {'store ms':>9} {'bare ms':>9} "
          f"{'store is x slower':>18} {'store CPU ms':>13} {'bare CPU ms':>12}")
    for figure in figures:
        print(f"{figure.backend:<10} {figure.operation:<26} {figure.store_rate:>9,.2f} {figure.bare_rate:>9,.2f} "
              f"{1000 / figure.store_rate:>9,.2f} {1000 / figure.bare_rate:>9,.2f} {figure.ratio:>18.2f} "
              f"{figure.store.cpu_ms:>13.2f} {figure.bare.cpu_ms:>12.2f}")


if __name__ == "__main__":
    main()
