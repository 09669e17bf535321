"""Two real Spark driver processes share a stream: exclusive reading, a drain without duplicates, failover on SIGKILL.

Each driver is `python -m tests.spark.driver_process` (its own JVM, `local[1]`) configured by SHARDHERD_* env, against
the session's moto server and kinesalite and a coordinator in this process; its sink appends rows to a file. A
producer thread writes records all along. Phases: drivers A and B start together and split the shards; B (whose
sink has a second, slow step) gets SIGTERM after a batch's rows were written (drain: the batch finishes, its shards
move to A); C (same sink) starts and takes shards from A by graceful handoff; C gets SIGKILL at the same point (its
shards fail over to A, which reads that batch again). Never more than two drivers run at once.

(The file sorts before the other Spark tests, so it runs before the session's own SparkSession starts.)
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
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from pathlib import Path

import pytest

from services.emulators.kinesalite import NodeEmulator
from services.emulators.moto_server import MotoServer
from shared.errors import StoreUnavailable
from tests.spark.driver_process import Row, busy_marker, read_rows
from tests.support.stream_stack import StreamStack
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SHARDS = 4
OWNER_SLACK = 0.6  # seconds between a row's write time and an ownership sample showing its writer as holder


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

    def close(self) -> None:
        self._halt.set()
        self._sampler.join(5)
        for driver in self.drivers.values():
            if driver.process.poll() is None:
                os.killpg(driver.process.pid, signal.SIGKILL)
            driver.process.wait(30)


@pytest.fixture
def fleet(moto_server: MotoServer, kinesalite: NodeEmulator, tmp_path: Path) -> Iterator[Fleet]:
    # Lease counts (not throughput) decide the split, so the drivers' shares are predictable: 2 and 2.
    stack = StreamStack(moto_server, kinesalite, SHARDS, prefix="spark", failover_millis=4000,
                        handoff_timeout_millis=10000, lease_assignment_strategy="lease-count")
    fleet = Fleet(stack, tmp_path)
    yield fleet
    fleet.close()
    stack.close()


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


def _seq(row: Row) -> tuple[int, int]:
    return int(row[1]), row[2]


def _runs(rows: list[Row]) -> dict[str, list[list[Row]]]:
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


def _reading_half(fleet: Fleet, driver: Driver) -> bool:
    return len(fleet.held_by(driver.worker)) == SHARDS // 2 and bool(driver.rows())


def _written(*drivers: Driver) -> set[tuple[str, str, int]]:
    return {(row[0], row[1], row[2]) for driver in drivers for row in driver.rows()}


def test_two_driver_processes_read_their_own_shards_drain_without_duplicates_and_fail_over_on_kill(
        fleet: Fleet) -> None:
    stack = fleet.stack
    began = time.monotonic()
    producer = Producer(stack, seed=5)
    try:
        a, b = fleet.start("driver-a"), fleet.start("driver-b", "--slow-write", "0.5")
        for driver in (a, b):
            wait_for(partial(_reading_half, fleet, driver), 60,
                     f"{driver.worker} holds {SHARDS // 2} shards and wrote rows\n{driver.tail()}")
        b_shards = fleet.held_by("driver-b")

        wait_for(busy_marker(b.out).exists, 30, "driver-b between a write and its checkpoint")
        b.process.send_signal(signal.SIGTERM)  # drain mid-batch: the batch finishes, B's shards move to A
        assert b.process.wait(60) == 0, b.tail()
        wait_for(lambda: fleet.held_by("driver-a") == set(stack.owners()), 30, "driver-a holds every shard")
        drained_at = time.time()

        c = fleet.start("driver-c", "--slow-write", "0.5")
        # Balancing decides how many shards C takes (by throughput): wait until it writes every shard it holds.
        wait_for(lambda: bool(held := fleet.held_by("driver-c")) and held <= {row[0] for row in c.rows()}, 60,
                 f"driver-c holds shards and wrote rows for them\n{c.tail()}")

        wait_for(busy_marker(c.out).exists, 30, "driver-c between a write and its checkpoint")
        c_shards = fleet.held_by("driver-c")
        os.killpg(c.process.pid, signal.SIGKILL)  # the whole driver (Python and JVM) dies at once
        killed_at = time.time()
        c.process.wait(30)
        at_kill = stack.checkpoints()  # nobody else can write them until the failover time passed
        wait_for(lambda: fleet.held_by("driver-a") == set(stack.owners()), 30, "driver-a took driver-c's shards")
        failed_over = time.time() - killed_at
        producer.stop()
        produced = {(shard, sequence, 0) for shard, sequence in stack.keys}
        wait_for(lambda: _written(a, b, c) >= produced, 30, "every record written")
    finally:
        producer.stop()
    a.process.send_signal(signal.SIGTERM)
    assert a.process.wait(60) == 0, a.tail()

    rows = [row for driver in (a, b, c) for row in driver.rows()]
    counts = Counter((row[0], row[1], row[2]) for row in rows)
    assert set(counts) == produced  # nothing lost, nothing invented
    # Duplicates: only records driver-c wrote after its last checkpoint, read again by driver-a after the kill.
    dupes = {key for key, count in counts.items() if count > 1}
    assert max(counts.values()) <= 2
    for shard, sequence, _ in dupes:
        assert shard in c_shards and int(sequence) > int(at_kill[shard]), (shard, sequence, at_kill[shard])
    c_after_checkpoint = {(r[0], r[1], r[2]) for r in c.rows() if int(r[1]) > int(at_kill[r[0]])}
    assert dupes == c_after_checkpoint and dupes  # C was killed after a write, before its checkpoint

    order = {shard: sorted(int(seq) for s, seq in stack.keys if s == shard) for shard in stack.owners()}
    tenures = _runs(rows)
    for shard, runs in tenures.items():
        assert len(runs) <= 5, [run[0][3] for run in runs]  # A->B split, drain, handoff to C, failover
        for before, after in pairwise(runs):
            start = _seq(after[0])[0]
            resume_after = int(at_kill[shard]) if before[0][3] == "driver-c" else _seq(before[-1])[0]
            # The next tenure starts at the first record after the previous one's checkpoint: no gap, no overlap.
            assert start == min(seq for seq in order[shard] if seq > resume_after), (shard, before[0][3], after[0][3])
            if before[0][3] != "driver-c":
                assert after[0][6] >= before[-1][6]
        for run in runs:
            worker = run[0][3]
            assert all(fleet.held_around(shard, worker, row[6]) for row in (run[0], run[-1])), (shard, worker)
    # (Each stretch's first and last rows were checked against the sampled lease holders above.)
    assert c_shards <= {row[0] for row in c.rows()} and b_shards <= {row[0] for row in b.rows()}
    assert not [row for row in b.rows() if row[6] > drained_at]
    assert failed_over < 4.0 + 3.0  # failover time plus a few assignment rounds
    moves = sum(len(runs) - 1 for runs in tenures.values())
    print(f"\ntwo driver processes: {len(produced)} records, {moves} moves between drivers, {len(dupes)} "
          f"duplicates after the kill, failover {failed_over:.1f} s, wall {time.monotonic() - began:.1f} s")
