"""Found by the chaos run (now fixed): a retrying liveness write must not delay the agent's self-fencing.

The keeper promises (agent/lease_keeper.py) that every lease is stopped once `failover - margin` has passed since the
last successful heartbeat send, so processing ends before the leader may give the shard to someone else. But the
keeper checks the deadline only between store calls, and one heartbeat upsert (or discovery query) against an
unreachable store keeps retrying (RetryPolicy: 8 attempts, up to 2 s apart) for several seconds. In the chaos run a
partitioned agent went on delivering a batch 0.8 s after the new owner had started and checkpointed past it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from shardherd.agent.lease_keeper import LeaseKeeper, LossReason
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import TRIM_HORIZON, Checkpoint
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings
from shardherd.shared.dynamo.store import DynamoLeaseStore
from shardherd.shared.errors import StoreUnavailable
from shardherd.shared.lease import Lease, new_lease
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.store import TableNames
from tests.support.chaos_proxy import Chaos, ChaosProxy
from tests.support.stores import unique_app

KEY = "shardId-000000000000"


@dataclass
class Told:
    """A listener noting the virtual time it was told each thing."""

    clock: ManualClock
    acquired: list[float] = field(default_factory=list)
    lost: list[tuple[float, LossReason]] = field(default_factory=list)

    def lease_acquired(self, lease: Lease) -> None:
        self.acquired.append(self.clock.monotonic())

    def handoff_requested(self, lease: Lease) -> None:
        """Not expected here."""

    def lease_lost(self, lease_key: str, reason: LossReason) -> None:
        self.lost.append((self.clock.monotonic(), reason))

    def leases_awaited(self, lease_keys: frozenset[str]) -> None:
        """Not expected here."""


@dataclass
class Holder:
    """A keeper holding KEY through a store behind a chaos proxy, on a virtual clock; `fence` is its deadline."""

    clock: ManualClock
    proxy: ChaosProxy
    store: DynamoLeaseStore
    keeper: LeaseKeeper
    told: Told
    fence: float


@contextmanager
def holding(moto_server: MotoServer, name: str) -> Iterator[Holder]:
    """A keeper that has just acquired KEY (heartbeats written); the fence is counted from the last tick."""
    clock = ManualClock()
    settings = load_settings(worker_id="w1", application_name=unique_app(name), failover_time_millis=2000)
    with ChaosProxy(moto_server.endpoint_url) as proxy:
        # Retry backoff sleeps on the virtual clock, so the seconds a retried call takes show up as virtual time.
        retry = RetryPolicy(clock=clock, rng=random.Random(3))
        store = DynamoLeaseStore(make_client("dynamodb", "us-east-1", proxy.endpoint_url),
                                 TableNames.for_application(settings.application_name), retry=retry)
        store.ensure_tables()
        store.create_lease(new_lease(KEY, TRIM_HORIZON))
        store.assign(KEY, "w1", None, None)
        told = Told(clock)
        keeper = LeaseKeeper(store, settings, clock, told)
        while not told.acquired:
            clock.advance(0.1)
            keeper.tick()
        margin = max(0.2, settings.failover_time_millis / 1000 * 0.1)
        # The last successful heartbeat was sent no later than now.
        fence = clock.monotonic() + settings.failover_time_millis / 1000 - margin
        try:
            yield Holder(clock, proxy, store, keeper, told, fence)
        finally:
            store.close()


def test_partitioned_agent_is_told_to_stop_by_its_fencing_deadline(moto_server: MotoServer) -> None:
    with holding(moto_server, "fence") as held:
        held.proxy.set(Chaos(partitioned=True))
        while not held.told.lost and held.clock.monotonic() < held.fence + 30:
            held.clock.advance(0.1)
            held.keeper.tick()
    assert held.told.lost and held.told.lost[0][1] is LossReason.SELF_FENCED
    late = held.told.lost[0][0] - held.fence
    assert late <= 0.1, f"told {late:.1f} s after the fencing deadline"


def test_a_checkpoint_against_a_failing_store_ends_by_the_fence(moto_server: MotoServer) -> None:
    """Issue 30: a checkpoint retried its 8 attempts (seconds of backoff) whatever the lease's fence.

    The shard thread checkpoints 0.3 s before the fence while every store call answers 500 (the keeper thread is
    stuck elsewhere: no tick). Its retries must give up by the fence (the old code slept on to 0.7 s past it).
    """
    with holding(moto_server, "ckpt-5xx") as held:
        held.clock.advance(held.fence - 0.3 - held.clock.monotonic())
        held.proxy.set(Chaos(error_rate=1.0))
        with pytest.raises(StoreUnavailable):
            held.keeper.checkpoint(KEY, Checkpoint("49590338271490256608559692538361571095921575989136588801"))
        ended = held.clock.monotonic()
        attempts = held.proxy.served["error"]
    assert attempts >= 2, "the checkpoint was retried"
    assert ended <= held.fence, f"the checkpoint's retries ran {ended - held.fence:.2f} s past the fence"


def test_no_checkpoint_is_written_after_the_fence(moto_server: MotoServer) -> None:
    """A shard thread checkpointing after the fence (its keeper thread stuck in a store call) writes nothing."""
    with holding(moto_server, "ckpt-late") as held:
        held.clock.advance(held.fence + 0.1 - held.clock.monotonic())
        sent = held.proxy.requests
        outcome = held.keeper.checkpoint(KEY, Checkpoint("49590338271490256608559692538361571095921575989136588801"))
        stored = held.store.get_lease(KEY)
        assert held.proxy.requests == sent + 1, "only the test's own read reached the store"
    assert not outcome.applied
    assert stored is not None and stored.checkpoint == TRIM_HORIZON
    assert [reason for _, reason in held.told.lost] == [LossReason.SELF_FENCED]
