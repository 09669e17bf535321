"""KCL -> shardherd -> KCL on one lease table, with the real Java KCL MultiLangDaemon (kclpy-ext).

Each side is stopped gracefully (KCL: SIGTERM with `shutdownGraceMillis`; shardherd: agent SIGTERM, coordinator
stop), new records are produced while nobody reads, and the other side must resume every shard exactly after the
stopped side's last checkpoint: nothing lost, and a record delivered twice only if it lies after the checkpoint
stored when the other side took over (the record processors checkpoint after every batch).
"""

from __future__ import annotations

import time

import pytest

from tests.kcl.harness import InteropStack, first_sequence_after, timed
from tests.support.kcl_worker import KclWorker
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.kcl, pytest.mark.slow, pytest.mark.timeout(240)]

RECORDS_PER_PHASE = 400


def resumed_exactly_after(stack: InteropStack, checkpoints: dict[str, str], prefix: str, reader: str) -> None:
    """Assert that `reader`'s first record of each shard is the first record after the shard's checkpoint."""
    by_shard: dict[str, list[str]] = {}
    for shard, sequence in stack.sequence.values():
        by_shard.setdefault(shard, []).append(sequence)
    first_read: dict[str, str] = {}
    for shard, sequence, _sub, worker, _time, data in stack.entries():
        if worker == reader and data.startswith(prefix) and shard not in first_read:
            first_read[shard] = sequence
    for shard, sequences in by_shard.items():
        expected = first_sequence_after(sequences, checkpoints[shard])
        assert first_read.get(shard) == expected, (
            f"{reader} started {shard} at {first_read.get(shard)}, expected {expected} (checkpoint "
            f"{checkpoints[shard]})")


def kcl_reads(stack: InteropStack, worker: str, prefix: str, figures: dict[str, float], label: str) -> KclWorker:
    """Start a KCL worker and wait until it has read every record starting with `prefix`; time it as `label`."""
    started = time.monotonic()
    kcl = stack.start_kcl(worker)
    wait_for(lambda: stack.all_delivered(prefix) or not kcl.running, 120, f"{worker} reads the {prefix} records")
    assert stack.all_delivered(prefix), kcl.log_tail()
    timed(label, started, figures)
    return kcl


@pytest.mark.parametrize("interop", ["worker"], indirect=True)
def test_kcl_to_shardherd_to_kcl_resumes_at_each_checkpoint(interop: InteropStack) -> None:
    stack, figures = interop, dict[str, float]()

    # Phase 1: the Java KCL worker creates the tables and leases and reads the first records.
    stack.produce(RECORDS_PER_PHASE, "a")
    kcl = kcl_reads(stack, "kcl-1", "a-", figures, "kcl start to all read")
    started = time.monotonic()
    assert kcl.stop() is not None
    timed("kcl graceful stop", started, figures)
    assert stack.leader() is None  # KCL's leader deletes the lock item when it stops: shardherd need not wait
    after_kcl = stack.checkpoints()
    assert len(after_kcl) == 4 and all(value.isdigit() for value in after_kcl.values()), after_kcl

    # Phase 2: shardherd continues KCL's table from KCL's checkpoints.
    stack.produce(RECORDS_PER_PHASE, "b")
    started = time.monotonic()
    stack.start_coordinator()
    stack.start_agent("agent-1")
    wait_for(lambda: stack.all_delivered("b-"), 60, "shardherd reads the records produced after KCL stopped")
    assert stack.leader() == "coordinator"
    timed("shardherd start to all read", started, figures)
    resumed_exactly_after(stack, after_kcl, "b-", "agent-1")
    started = time.monotonic()
    assert stack.stop_agent("agent-1") == 0
    stack.stop_coordinator()
    timed("shardherd graceful stop", started, figures)
    assert stack.leader() is None and set(stack.owners().values()) == {None}  # lock deleted, leases given back
    after_shardherd = stack.checkpoints()
    assert all(int(after_shardherd[key]) > int(after_kcl[key]) for key in after_kcl), (after_kcl, after_shardherd)

    # Phase 3: KCL again, from shardherd's checkpoints, reading every attribute shardherd wrote.
    stack.produce(RECORDS_PER_PHASE, "c")
    kcl = kcl_reads(stack, "kcl-2", "c-", figures, "kcl restart to all read")
    resumed_exactly_after(stack, after_shardherd, "c-", "kcl-2")
    assert stack.leader() == "kcl-2"
    kcl.stop()

    counts = stack.delivered()
    lost = set(stack.produced) - set(counts)
    repeated = sorted(data for data, count in counts.items() if count > 1)
    print(f"KCL -> shardherd -> KCL: {figures}; lost {len(lost)}, re-delivered {len(repeated)}")
    assert not lost
    # Graceful stops checkpoint the last batch, so the next side starts right after it: nothing is read twice.
    assert not repeated, repeated[:10]
