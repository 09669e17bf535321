"""What the running stack looks like: a live status, the memory of the process tree, the startup time.

The status is a live table on a terminal, one line per interval otherwise.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psutil
from rich.console import Console
from rich.live import Live
from rich.table import Table

from services.local_stack.stack import LocalStack
from services.status_cli import ApiError, OperatorClient
from shared.store import LeaseStore


def tree_memory(pid: int) -> tuple[int, int]:
    """Resident bytes of process `pid` and all its descendants, and how many processes that is."""
    root = psutil.Process(pid)
    total, count = 0, 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
            count += 1
        except psutil.NoSuchProcess:
            continue
    return total, count


@dataclass
class Snapshot:
    """One read of the operator API."""

    leader: str | None
    epoch: int | None
    workers: list[dict[str, Any]]
    leases: list[dict[str, Any]]

    @property
    def unfinished(self) -> list[dict[str, Any]]:
        """Leases of shards still being read."""
        return [lease for lease in self.leases if lease["state"] != "finished"]

    @property
    def owned(self) -> int:
        """Unfinished leases someone processes."""
        return sum(1 for lease in self.unfinished if lease["owner"] or lease["checkpoint_owner"])


def read_snapshot(urls: list[str], timeout: float = 3.0) -> Snapshot | None:
    """The view from the first replica that answers, or None if none does."""
    for url in urls:
        client = OperatorClient(url, None, timeout)
        try:
            leader = client.call("GET", "/v1/leader")["lock"]
            workers = client.call("GET", "/v1/workers")["items"]
            return Snapshot(leader["owner"], leader["epoch"], workers, client.leases())
        except ApiError:
            continue
        finally:
            client.close()
    return None


@dataclass
class StartupTimes:
    """Seconds from process start to the first owned lease, every shard owned, and the first checkpoint.

    The first checkpoint means records went all the way: read, processed (for Spark agents: written as Parquet) and
    their position stored in the lease table.
    """

    first_assignment: float | None = None
    all_assigned: float | None = None
    first_checkpoint: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def watch(self, store: LeaseStore, shards: int, started: float, timeout: float = 120.0) -> None:
        """Poll the lease table every 100 ms until `shards` leases are owned and one has a checkpoint (or timeout)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self.all_assigned is None or self.first_checkpoint is None):
            try:
                leases = [lease for lease in store.scan_leases().leases if not lease.is_finished]
            except Exception:  # tables may not answer for the first moments
                leases = []
            owned = sum(1 for lease in leases if lease.actual_owner)
            if owned and self.first_assignment is None:
                self.first_assignment = time.time() - started
            if owned >= shards and owned == len(leases) and self.all_assigned is None:
                self.all_assigned = time.time() - started
            if self.first_checkpoint is None and any(lease.checkpoint.sequence_value is not None for lease in leases):
                self.first_checkpoint = time.time() - started
            time.sleep(0.1)
        self.done.set()


class StatusPrinter:
    """Refreshes the status every `interval` s; reports leader changes and processes that exited on their own."""

    def __init__(self, stack: LocalStack, console: Console, interval: float, started: float) -> None:
        self._stack = stack
        self._console = console
        self._interval = interval
        self._started = started
        self._leader: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status", daemon=True)

    def start(self) -> StatusPrinter:
        """Start refreshing in the background."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop refreshing."""
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        if self._console.is_terminal:
            with Live(console=self._console, refresh_per_second=2, transient=False) as live:
                while not self._stop.wait(self._interval):
                    live.update(self._render(self._observe()))
        else:
            while not self._stop.wait(self._interval):
                self._console.print(self._line(self._observe()), highlight=False, soft_wrap=True)

    def _observe(self) -> Snapshot | None:
        for child in self._stack.supervisor.unexpected_exits():
            self._console.print(f"! {child.name} exited on its own (code {child.process.returncode}); "
                                f"log: {child.log_path}", highlight=False)
            self._stack.write_state()
        snapshot = read_snapshot([c.api_url for c in self._stack.supervisor.children("coordinator") if c.api_url])
        if snapshot is not None and snapshot.leader != self._leader:
            self._console.print(f"* leader is now {snapshot.leader or 'nobody'} (epoch {snapshot.epoch})",
                                highlight=False)
            self._leader = snapshot.leader
        return snapshot

    def _summary(self, snapshot: Snapshot | None) -> str:
        memory, count = tree_memory(os.getpid())
        producer = self._stack.producer
        produced = producer.stats.user_records if producer else 0
        head = f"up {time.time() - self._started:.0f} s | {memory / 2**20:.0f} MiB in {count} processes | " \
               f"produced {produced} records"
        if snapshot is None:
            return head + " | coordinator API not answering yet"
        processed = sum(lease["records_processed"] or 0 for lease in snapshot.leases)
        return (f"{head} | leader {snapshot.leader or '-'} | {snapshot.owned}/{len(snapshot.unfinished)} shards "
                f"owned | {processed} records processed by current owners")

    def _line(self, snapshot: Snapshot | None) -> str:
        if snapshot is None:
            return self._summary(snapshot)
        per_worker = Counter(lease["checkpoint_owner"] or lease["owner"] for lease in snapshot.unfinished
                             if lease["owner"])
        workers = " ".join(f"{worker}:{count}" for worker, count in sorted(per_worker.items()))
        return f"{self._summary(snapshot)} | leases {workers}"

    def _render(self, snapshot: Snapshot | None) -> Table:
        table = Table(title=f"shardherd up — dashboard {self._stack.state().dashboard_url}",
                      caption=self._summary(snapshot))
        for column in ("shard", "owner", "state", "records", "lag ms", "KiB/s"):
            table.add_column(column, justify="left" if column in ("shard", "owner", "state") else "right")
        for lease in snapshot.leases if snapshot else []:
            owner = lease["checkpoint_owner"] or lease["owner"] or "-"
            if lease["checkpoint_owner"]:
                owner += f" → {lease['owner']}"
            table.add_row(lease["shard_id"], owner, lease["state"], _text(lease["records_processed"]),
                          _text(lease["millis_behind_latest"]), _text(lease["throughput_kbps"]))
        return table


def _text(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)
