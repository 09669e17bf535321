"""Conformance: real races. Threads and spawned processes, each with its own store, contend on one lease.

Every round all contenders read the lease, meet at a barrier, then write at once. The operations of a round are
chosen so that exactly one write can win (each write invalidates the others' conditions): the owner's renewals race
on the counter; the leader's assignments to distinct new owners race on the owner. At the end the counter equals the
number of applied writes and the owner is the one the last owner-changing winner set.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import pytest

from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.lease import Lease
from shardherd.shared.store import Conflict, LeaseStore, Outcome
from tests.store.conftest import Leases, StoreSpec, expect_applied

KEY = "shardId-000000000000"
FIRST_OWNER = "worker-init"
BARRIER_TIMEOUT = 120.0

# Each mix lists the operation of contender i (cycled). "checkpoint" appears at most once per mix.
MIXES: dict[str, tuple[str, ...]] = {
    "renew": ("renew",),
    "assign": ("assign",),
}
OWNER_CHANGING = frozenset({"assign"})


@dataclass(frozen=True)
class Attempt:
    """One contender's write in one round, as it saw and got it."""

    round: int
    contender: int
    operation: str
    new_owner: str | None
    applied: bool
    conflict: str
    counter_seen: int
    counter_after: int | None


class _Barrier(Protocol):
    def wait(self, timeout: float | None = None) -> int: ...

    def abort(self) -> None: ...


class _Results(Protocol):
    def put(self, item: list[Attempt]) -> None: ...


def operation_of(mix: str, contender: int) -> str:
    """The operation contender `contender` performs under `mix`."""
    operations = MIXES[mix]
    return operations[contender % len(operations)]


def write(store: LeaseStore, operation: str, seen: Lease, new_owner: str, round_number: int) -> Outcome:
    """Perform `operation` on the lease as read in `seen`; the current owner renews and checkpoints."""
    owner = seen.lease_owner
    assert owner is not None
    if operation == "renew":
        return store.renew(KEY, owner, seen.lease_counter)
    if operation == "assign":
        return store.assign(KEY, new_owner, owner, None)
    raise ValueError(f"unknown operation {operation}")


def contend(spec: StoreSpec, contender: int, mixes: list[str], barrier: _Barrier, results: _Results) -> None:
    """One contender: for every round read, wait for all, write, wait for all; then report its attempts."""
    store = spec.open()
    attempts: list[Attempt] = []
    try:
        for round_number, mix in enumerate(mixes):
            seen = store.get_lease(KEY)
            assert seen is not None
            operation = operation_of(mix, contender)
            new_owner = f"worker-{contender}-round-{round_number}"
            barrier.wait(BARRIER_TIMEOUT)
            outcome = write(store, operation, seen, new_owner, round_number)
            attempts.append(Attempt(
                round_number, contender, operation, new_owner if operation in OWNER_CHANGING else None,
                outcome.applied, outcome.conflict.name, seen.lease_counter,
                outcome.lease.lease_counter if outcome.lease else None,
            ))
            barrier.wait(BARRIER_TIMEOUT)
    except BaseException:
        barrier.abort()  # release the others at once instead of letting them time out
        raise
    finally:
        results.put(attempts)
        store.close()


def check_rounds(store: LeaseStore, start: Lease, attempts: list[Attempt], rounds: int) -> None:
    """Exactly one winner per round, losers lost on OWNERSHIP, counter and owner consistent at the end."""
    owner = start.lease_owner
    counter = start.lease_counter
    for round_number in range(rounds):
        this_round = [attempt for attempt in attempts if attempt.round == round_number]
        winners = [attempt for attempt in this_round if attempt.applied]
        assert len(winners) == 1, f"round {round_number}: winners {winners}"
        assert all(attempt.counter_seen == counter for attempt in this_round)
        assert all(attempt.conflict == Conflict.OWNERSHIP.name for attempt in this_round if not attempt.applied)
        counter += 1
        assert winners[0].counter_after == counter
        if winners[0].new_owner is not None:
            owner = winners[0].new_owner
    final = store.get_lease(KEY)
    assert final is not None
    assert final.lease_counter == start.lease_counter + rounds
    assert final.lease_owner == owner


def run_race(spec: StoreSpec, store: LeaseStore, mixes: list[str], contenders: int, processes: bool) -> None:
    """Race `contenders` threads or spawned processes through one round per entry of `mixes`, then check."""
    start = Leases(store).owned(FIRST_OWNER, KEY)
    collected: list[Attempt] = []
    if processes:
        context = multiprocessing.get_context("spawn")
        process_barrier = context.Barrier(contenders)
        process_results: multiprocessing.queues.Queue[list[Attempt]] = context.Queue()
        workers = [context.Process(target=contend, args=(spec, index, mixes, process_barrier, process_results))
                   for index in range(contenders)]
        for worker in workers:
            worker.start()
        for _ in workers:
            collected.extend(process_results.get(timeout=BARRIER_TIMEOUT * 2))
        for worker in workers:
            worker.join(timeout=BARRIER_TIMEOUT)
            assert worker.exitcode == 0
    else:
        thread_barrier = threading.Barrier(contenders)
        thread_results: queue.Queue[list[Attempt]] = queue.Queue()
        threads = [threading.Thread(target=contend, args=(spec, index, mixes, thread_barrier, thread_results))
                   for index in range(contenders)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=BARRIER_TIMEOUT * 2)
        while not thread_results.empty():
            collected.extend(thread_results.get_nowait())
    assert len(collected) == contenders * len(mixes), "a contender failed before finishing its rounds"
    check_rounds(store, start, collected, len(mixes))


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_threads_race_one_winner_per_round(store: LeaseStore, store_spec: StoreSpec, mix: str) -> None:
    run_race(store_spec, store, [mix] * 4, contenders=8, processes=False)


@pytest.mark.slow
def test_processes_race_one_winner_per_round(store: LeaseStore, store_spec: StoreSpec) -> None:
    if store_spec.backend == "memory":
        pytest.skip("the memory backend lives in one process: spawned processes cannot share it")
    mixes = sorted(MIXES) * 2
    run_race(store_spec, store, mixes, contenders=6, processes=True)




def race_checkpoint_and_move(spec: StoreSpec, owner: str, new_owner: str,
                             checkpoint: Checkpoint) -> tuple[Outcome, Outcome]:
    """The owner's checkpoint and the leader's assignment to `new_owner`, sent at once from two stores."""
    barrier = threading.Barrier(2)
    outcomes: dict[str, Outcome] = {}

    def send(name: str, act: Callable[[LeaseStore], Outcome]) -> None:
        contender = spec.open()
        try:
            barrier.wait(BARRIER_TIMEOUT)
            outcomes[name] = act(contender)
        finally:
            contender.close()

    threads = [threading.Thread(target=send, args=("checkpoint", lambda s: s.checkpoint(KEY, owner, checkpoint))),
               threading.Thread(target=send, args=("assign", lambda s: s.assign(KEY, new_owner, owner, None)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BARRIER_TIMEOUT)
    return outcomes["checkpoint"], outcomes["assign"]


def test_an_owners_checkpoint_racing_the_leaders_move_applies_only_while_it_still_owns(
        store: LeaseStore, store_spec: StoreSpec) -> None:
    """Both may apply, the checkpoint first (the moved row carries it); a checkpoint after the move is refused."""
    start = Leases(store).owned(FIRST_OWNER, KEY)
    owner, counter = FIRST_OWNER, start.lease_counter
    for round_number in range(6):
        new_owner, checkpoint = f"worker-round-{round_number}", Checkpoint.at(10**120 + round_number)
        saved, move = race_checkpoint_and_move(store_spec, owner, new_owner, checkpoint)
        moved = expect_applied(move)
        counter += 1 + int(saved.applied)
        if saved.applied:
            assert saved.lease is not None and saved.lease.lease_owner == owner
            assert moved.checkpoint == checkpoint
        else:
            assert saved.conflict is Conflict.OWNERSHIP and moved.checkpoint != checkpoint
        owner = new_owner
    final = store.get_lease(KEY)
    assert final is not None and (final.lease_owner, final.lease_counter) == (owner, counter)
