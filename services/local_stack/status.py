"""What the running stack looks like: a live status, the memory of the process tree, the startup time.

The status is a live table on a terminal, one line per interval otherwise.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.live import Live
from rich.table import Table

from shardherd.services.local_stack.processor import KEYS_SUFFIX
from shardherd.services.local_stack.stack import AGENT, COORDINATOR, LocalStack
from shardherd.services.local_stack.supervisor import Child
from shardherd.services.status_cli import ApiError, OperatorClient
from shardherd.shared.lease import Lease
from shardherd.shared.store import LeaseStore


def _rss(process: psutil.Process) -> int | None:
    try:
        return int(process.memory_info().rss)
    except psutil.Error:
        return None


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def memory_line(stack: LocalStack) -> str:
    """`N MiB in K processes, agents A MiB (a, b, c)`: one read of each process, so the agents never sum past the total.

    Each agent counts its process tree (with Spark, the JVM and Python workers too).
    """
    sizes = {process.pid: size for process in _tree(os.getpid()) if (size := _rss(process)) is not None}
    agents = sorted((sum(sizes.get(process.pid, 0) for process in _tree(child.pid))
                     for child in stack.supervisor.children(AGENT)), reverse=True)
    total = f"{sum(sizes.values()) / 2**20:.0f} MiB in {len(sizes)} processes"
    if not agents:
        return f"{total}, no agents"
    return f"{total}, agents {sum(agents) / 2**20:.0f} MiB ({', '.join(f'{size / 2**20:.0f}' for size in agents)})"


class SinkCount:
    """Records the stack's agents wrote to their output so far, read incrementally (each file's new part only).

    Plain agents append one key per record to `<dir>/<agent>/<shard>.keys`; Spark agents commit Parquet files under
    `<dir>/<agent>/` (a committed file never changes; `_temporary` holds the ones being written). Rows, not distinct
    keys: a record is written twice only after a crash or a non-graceful move, so the count stays within a fraction
    of a percent of the distinct count `up` prints at the end.
    """

    def __init__(self, directory: Path, parquet: bool) -> None:
        self._directory = directory
        self._parquet = parquet
        self._read: dict[Path, int] = {}  # file -> bytes read (keys) or rows (Parquet)
        self._lines = 0

    def total(self) -> int:
        """Records in the output now."""
        if self._parquet:
            import pyarrow.parquet as pq  # type: ignore[import-untyped]

            for path in self._directory.glob("*/*.parquet"):
                if path not in self._read:
                    try:
                        self._read[path] = int(pq.read_metadata(path).num_rows)
                    except (OSError, ValueError):
                        continue  # still being moved into place: next time
            return sum(self._read.values())
        for path in self._directory.glob(f"*/*{KEYS_SUFFIX}"):
            with path.open("rb") as keys:
                keys.seek(self._read.get(path, 0))
                chunk = keys.read()
            complete = chunk.rfind(b"\n") + 1  # a line being appended is counted once it ends
            self._read[path] = self._read.get(path, 0) + complete
            self._lines += chunk.count(b"\n", 0, complete)
        return self._lines


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
    """The view from the replicas (failing over between them), or None if none answers."""
    if not urls:
        return None
    client = OperatorClient(urls, None, timeout)
    try:
        leader = client.call("GET", "/v1/leader")["lock"]
        workers = client.call("GET", "/v1/workers")["items"]
        return Snapshot(leader["owner"], leader["epoch"], workers, client.leases())
    except ApiError:
        return None
    finally:
        client.close()


@dataclass
class StartupTimes:
    """Seconds from the command's start to the first owned lease, every shard owned, and the first checkpoint.

    The first checkpoint means records went all the way: read, processed (for Spark agents: written as Parquet) and
    their position stored in the lease table. `waiting_for()` says what is still missing, for a start-up that does not
    complete in time.
    """

    first_assignment: float | None = None
    all_assigned: float | None = None
    first_checkpoint: float | None = None
    owned: int = 0
    leases: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)

    @property
    def complete(self) -> bool:
        """Every shard owned and a first checkpoint written."""
        return self.all_assigned is not None and self.first_checkpoint is not None

    def waiting_for(self, shards: int) -> str:
        """What start-up still waits for, in words."""
        if self.leases == 0:
            return f"the leader to create the leases of the {shards} shards (no lease in the table yet)"
        if self.all_assigned is None:
            return f"every shard to be owned ({self.owned} of {self.leases} leases owned)"
        return "a first checkpoint (records read, processed and their position stored)"

    def watch(self, store: LeaseStore, shards: int, started: float) -> None:
        """Poll the lease table every 100 ms until `shards` leases are owned and one has a checkpoint (or cancel)."""
        while not self.complete and not self.cancelled.is_set():
            try:
                leases = [lease for lease in store.scan_leases().leases if not lease.is_finished]
            except Exception:  # tables may not answer for the first moments
                leases = []
            self._note(leases, shards, time.time() - started)
            self.cancelled.wait(0.1)
        self.done.set()

    def _note(self, leases: list[Lease], shards: int, elapsed: float) -> None:
        """Take one look at the unfinished leases, `elapsed` seconds after the start."""
        self.owned, self.leases = sum(1 for lease in leases if lease.actual_owner), len(leases)
        if self.owned and self.first_assignment is None:
            self.first_assignment = elapsed
        if self.owned >= shards and self.owned == len(leases) and self.all_assigned is None:
            self.all_assigned = elapsed
        if self.first_checkpoint is None and any(lease.checkpoint.sequence_value is not None for lease in leases):
            self.first_checkpoint = elapsed


class ShardTally:
    """Records processed per shard since the stack started, across moves.

    Owners report records handled since they took a lease (the count restarts with every new owner, and with the same
    owner taking it again). The tally keeps each (lease, owner) pair's last report and banks it when the count
    restarts, so a move does not make the total drop. What an owner processed after its last report before a move is
    not seen: the total is a lower bound, exact again at the next report of a steady owner.
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], int] = {}
        self._banked: Counter[str] = Counter()
        self._guard = threading.Lock()

    def update(self, leases: list[dict[str, Any]]) -> None:
        """Take one read of the leases (as the operator API lists them)."""
        with self._guard:
            for lease in leases:
                holder, value = lease["checkpoint_owner"] or lease["owner"], lease["records_processed"]
                if holder is None or value is None:
                    continue
                key = (lease["lease_key"], holder)
                last = self._last.get(key, 0)
                if value < last:
                    self._banked[lease["lease_key"]] += last
                self._last[key] = value

    def totals(self) -> dict[str, int]:
        """Lease key -> records processed since the start."""
        with self._guard:
            totals = Counter(self._banked)
            for (lease_key, _), value in self._last.items():
                totals[lease_key] += value
        return dict(totals)


class StatusPrinter:
    """Refreshes the status every `interval` s; reports leader changes and processes that exited on their own.

    It also starts exited agents and coordinators again when their delay has passed (restarts.py).
    """

    def __init__(self, stack: LocalStack, console: Console, interval: float, started: float) -> None:
        self._stack = stack
        self._console = console
        self._interval = interval
        self._started = started
        self._leader: str | None = None
        self.tally = ShardTally()
        options = stack.options
        self.sink = SinkCount(options.pipeline_dir / "records" if options.spark else options.plain_records_dir,
                              parquet=options.spark)
        self.outside: set[str] = set()  # workers that held leases of the stack but are none of its agents
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
        self._report_processes()
        snapshot = read_snapshot([c.api_url for c in self._stack.supervisor.children("coordinator") if c.api_url])
        if snapshot is not None:
            self.tally.update(snapshot.leases)
            agents = {child.name for child in self._stack.supervisor.children(AGENT, alive_only=False)}
            self.outside.update(owner for lease in snapshot.leases for owner in (lease["owner"],)
                                if owner and owner not in agents)
        if snapshot is not None and snapshot.leader != self._leader:
            self._console.print(f"* leader is now {snapshot.leader or 'nobody'} (epoch {snapshot.epoch})",
                                highlight=False)
            self._leader = snapshot.leader
        return snapshot

    def _report_processes(self) -> None:
        """Print processes that exited on their own, were started again or ended on purpose, and a Kinesis exit."""
        for child in self._stack.supervisor.unexpected_exits():
            pending = self._stack.restarts.exited(child)
            again = f"; starting it again in {pending.delay:g} s" if pending is not None else ""
            self._console.print(f"! {child.name} exited on its own (code {child.process.returncode}){again}; "
                                f"log: {child.log_path}", highlight=False)
            self._stack.write_state()
        for child in self._stack.restarts.start_due():
            self._console.print(f"* {child.name} started again (pid {child.pid})", highlight=False)
            self._stack.write_state()
        for child in self._stack.supervisor.ended_on_purpose():
            self._console.print(self._gone(child), highlight=False)
            self._stack.write_state()
        if (exited := self._stack.emulators.kinesis_exit()) is not None:
            self._console.print(f"! {exited}", highlight=False)

    def _gone(self, child: Child) -> str:
        """The line for a process a scenario ended: it is not started again; where the dashboard is now."""
        line = f"- {child.name} ended on purpose (code {child.process.returncode}); not started again"
        if child.role == COORDINATOR:
            live = [c.api_url for c in self._stack.supervisor.children(COORDINATOR) if c.api_url]
            line += f"; dashboard: {live[0]}/" if live else "; no coordinator runs: no dashboard"
        return line

    def _summary(self, snapshot: Snapshot | None) -> str:
        producer = self._stack.producer
        produced = producer.stats.user_records if producer else 0
        head = f"up {time.time() - self._started:.0f} s | {memory_line(self._stack)} | produced {produced} records"
        if snapshot is None:
            return head + " | coordinator API not answering yet"
        return (f"{head} | leader {snapshot.leader or '-'} | {snapshot.owned}/{len(snapshot.unfinished)} shards "
                f"owned | {self.sink.total()} records in the agents' output")

    def _line(self, snapshot: Snapshot | None) -> str:
        if snapshot is None:
            return self._summary(snapshot)
        return f"{self._summary(snapshot)} | {worker_line(snapshot)}"

    def _render(self, snapshot: Snapshot | None) -> Table:
        return lease_table(snapshot, self.tally.totals(),
                           f"shardherd up — dashboard {self._stack.state().dashboard_url}", self._summary(snapshot))


def lease_table(snapshot: Snapshot | None, totals: dict[str, int], title: str, caption: str) -> Table:
    """The live table: one row per lease with its owner, records processed since start, lag and records behind."""
    table = Table(title=title, caption=caption)
    for column in ("shard", "owner", "state", "records", "lag ms", "behind", "KiB/s"):
        table.add_column(column, justify="left" if column in ("shard", "owner", "state") else "right")
    for lease in snapshot.leases if snapshot else []:
        owner = lease["checkpoint_owner"] or lease["owner"] or "-"
        if lease["checkpoint_owner"]:
            owner += f" → {lease['owner']}"
        table.add_row(lease["shard_id"], owner, lease["state"], _text(totals.get(lease["lease_key"])),
                      _text(lease["millis_behind_latest"]), _text(lease["records_behind"]),
                      _text(lease["throughput_kbps"]))
    return table


def worker_line(snapshot: Snapshot) -> str:
    """Per agent, one line: leases held, the largest lag among them and the records behind summed over them.

    `lag -`/`behind -` while no lease of the agent reported the figure (records behind is known only where the owner
    read up to the stream's tip).
    """
    held: dict[str, list[dict[str, Any]]] = {}
    for lease in snapshot.unfinished:
        if lease["owner"]:
            held.setdefault(lease["checkpoint_owner"] or lease["owner"], []).append(lease)
    parts = []
    for worker, leases in sorted(held.items()):
        lags = [lease["millis_behind_latest"] for lease in leases if lease["millis_behind_latest"] is not None]
        behind = [lease["records_behind"] for lease in leases if lease["records_behind"] is not None]
        parts.append(f"{worker}: {len(leases)} leases, lag {_text(max(lags) if lags else None)} ms, "
                     f"behind {_text(sum(behind) if behind else None)}")
    return "leases " + ("; ".join(parts) if parts else "none owned")


def _text(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)
