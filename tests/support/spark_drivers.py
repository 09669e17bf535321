"""Real Spark driver processes on a StreamStack, a steady producer, and the ledger checks of multi-driver tests.

A driver is `python -m tests.spark.driver_process` (its own JVM, local mode or client mode on a cluster) configured
by SHARDHERD_* env; its sink appends rows to a file (`tests/spark/driver_process.py`). The checks read those files:
nothing lost, duplicates only after the killed driver's last checkpoint, each shard's tenures back to back.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from shardherd.shared.errors import StoreUnavailable
from tests.spark.driver_process import Row, read_rows
from tests.support.stream_stack import StreamStack

REPO = Path(__file__).resolve().parents[2]
OWNER_SLACK = 0.6  # seconds between a row's write time and an ownership sample showing its writer as holder

Key = tuple[str, str, int]


@dataclass
class Driver:
    """One driver process and the file its sink writes."""

    worker: str
    process: subprocess.Popen[bytes]
    out: Path
    log: Path

    def rows(self) -> list[Row]:
        return read_rows(self.out)

    def tail(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-3000:] if self.log.exists() else ""


class Fleet:
    """Starts driver processes on a StreamStack, samples lease holders, and cleans up every process it started."""

    def __init__(self, stack: StreamStack, tmp: Path) -> None:
        self.stack = stack
        self.tmp = tmp
        self.drivers: dict[str, Driver] = {}
        self.samples: list[tuple[float, dict[str, str | None]]] = []
        self._halt = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="holder-sampler", daemon=True)
        self._sampler.start()

    def start(self, worker: str, *options: str) -> Driver:
        """Start driver `worker` (its own process group) with driver_process `options`."""
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.update({f"SHARDHERD_{key.upper()}": str(value) for key, value in self.stack.base.items()})
        env["SHARDHERD_WORKER_ID"] = worker
        tmp = self.tmp
        log = tmp / f"{worker}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.spark.driver_process", "--out", str(tmp / f"{worker}.jsonl"),
                 "--checkpoint", str(tmp / f"cp-{worker}"), "--channel", str(tmp / f"channel-{worker}"), *options],
                cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        driver = Driver(worker, process, tmp / f"{worker}.jsonl", log)
        self.drivers[worker] = driver
        return driver

    def held_by(self, worker: str) -> set[str]:
        return {shard for shard, owner in self.stack.owners().items() if owner == worker}

    def writes_all_it_holds(self, driver: Driver, count: int | None = None) -> bool:
        """Whether `driver` holds shards (`count` of them, if given) and has written rows for every one it holds.

        Rows for only some of them are not enough: a shard that changed hands just before is written a batch later,
        and the tests' ends check that each driver wrote every shard it was seen to hold.
        """
        held = self.held_by(driver.worker)
        return bool(held) and len(held) == (count or len(held)) and held <= {row[0] for row in driver.rows()}

    def report(self, what: str) -> str:
        """`what`, then for every driver: whether it still runs, the shards it holds and has written, and the end of
        its log (a timed-out wait's message: a peer that died is often why a driver did not get its share)."""
        parts = [what]
        for driver in self.drivers.values():
            code = driver.process.poll()
            written = sorted({row[0] for row in driver.rows()})
            parts.append(f"--- {driver.worker} ({'running' if code is None else f'exited {code}'}): holds "
                         f"{sorted(self.held_by(driver.worker))}, wrote {written}\n{driver.tail()}")
        return "\n".join(parts)

    def holders(self) -> dict[str, str | None]:
        """Who may write each shard: the finishing owner during a handoff, else the owner."""
        return {lease.lease_key: lease.checkpoint_owner or lease.lease_owner
                for lease in self.stack.coordinator.store.scan_leases().leases}

    def _sample(self) -> None:
        while not self._halt.wait(0.15):
            try:
                self.samples.append((time.time(), self.holders()))
            except StoreUnavailable:
                continue  # one missing sample

    def held_around(self, shard: str, worker: str, stamp: float) -> bool:
        return any(holders.get(shard) == worker for at, holders in self.samples if abs(at - stamp) <= OWNER_SLACK)

    def written(self) -> set[Key]:
        """(shard, sequence, sub-sequence) of every row any driver wrote."""
        return {key(row) for driver in self.drivers.values() for row in driver.rows()}

    def rows(self) -> list[Row]:
        return [row for driver in self.drivers.values() for row in driver.rows()]

    def close(self) -> None:
        self._halt.set()
        self._sampler.join(5)
        for driver in self.drivers.values():
            if driver.process.poll() is None:
                os.killpg(driver.process.pid, signal.SIGKILL)
            driver.process.wait(30)


class Producer:
    """Puts a few records every 0.2 s until stopped (seeded sizes), so every phase has records in flight."""

    def __init__(self, stack: StreamStack, seed: int) -> None:
        self._stack = stack
        self._rng = random.Random(seed)
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tick = 0
        while not self._halt.wait(0.2):
            self._stack.produce(self._rng.randint(8, 16), f"t{tick}")
            tick += 1

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(10)


def key(row: Row) -> Key:
    """The record a row is: (shard, sequence, sub-sequence)."""
    return row[0], row[1], row[2]


def _seq(row: Row) -> tuple[int, int]:
    return int(row[1]), row[2]


def tenures(rows: list[Row]) -> dict[str, list[list[Row]]]:
    """Per shard, its rows in write order cut into runs of one worker (a run is one tenure of that shard)."""
    by_shard: dict[str, list[Row]] = defaultdict(list)
    for row in sorted(rows, key=lambda row: (row[6], _seq(row))):
        by_shard[row[0]].append(row)
    runs: dict[str, list[list[Row]]] = {}
    for shard, ordered in by_shard.items():
        runs[shard] = []
        for row in ordered:
            if runs[shard] and runs[shard][-1][-1][3] == row[3]:
                runs[shard][-1].append(row)
            else:
                runs[shard].append([row])
    return runs


def position(checkpoint: str) -> int:
    """A lease checkpoint as a sequence number to compare with: TRIM_HORIZON (nothing checkpointed yet) is before
    every record."""
    return -1 if checkpoint == "TRIM_HORIZON" else int(checkpoint)


def check_delivery(fleet: Fleet, killed: Driver, at_kill: dict[str, str]) -> set[Key]:
    """Every produced record written, nothing invented; the duplicates (returned) are exactly the rows `killed` wrote
    after its lease checkpoints `at_kill`, read again by the next holder."""
    counts = Counter(key(row) for row in fleet.rows())
    assert set(counts) == {(shard, sequence, 0) for shard, sequence in fleet.stack.keys}  # nothing lost or invented
    dupes = {record for record, count in counts.items() if count > 1}
    assert max(counts.values()) <= 2
    after_checkpoint = {key(row) for row in killed.rows() if int(row[1]) > position(at_kill[row[0]])}
    assert dupes == after_checkpoint, (sorted(dupes - after_checkpoint)[:5], sorted(after_checkpoint - dupes)[:5])
    return dupes


def check_tenures(fleet: Fleet, killed: Driver, at_kill: dict[str, str], max_runs: int) -> int:
    """Each shard's tenures follow one another: the next starts at the first record after the previous one's
    checkpoint (the killed driver's: its lease checkpoint at the kill), no gap, no overlap, and each tenure's writer
    held the lease then. Returns the number of moves between drivers."""
    order: dict[str, list[int]] = defaultdict(list)
    for shard, sequence in fleet.stack.keys:
        order[shard].append(int(sequence))
    moves = 0
    for shard, runs in tenures(fleet.rows()).items():
        assert len(runs) <= max_runs, [run[0][3] for run in runs]
        moves += len(runs) - 1
        for before, after in pairwise(runs):
            resume_after = position(at_kill[shard]) if before[0][3] == killed.worker else _seq(before[-1])[0]
            assert _seq(after[0])[0] == min(seq for seq in order[shard] if seq > resume_after), (
                shard, before[0][3], after[0][3])
            if before[0][3] != killed.worker:
                assert after[0][6] >= before[-1][6]
        for run in runs:
            worker = run[0][3]
            assert all(fleet.held_around(shard, worker, row[6]) for row in (run[0], run[-1])), (shard, worker)
    return moves
