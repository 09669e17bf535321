"""Found by the chaos run (now fixed): a retrying liveness write must not delay the agent's self-fencing.

The keeper promises (agent/lease_keeper.py) that every lease is stopped once `failover - margin` has passed since the
last successful heartbeat send, so processing ends before the leader may give the shard to someone else. But the
keeper checks the deadline only between store calls, and one heartbeat upsert (or discovery query) against an
unreachable store keeps retrying (RetryPolicy: 8 attempts, up to 2 s apart) for several seconds. In the chaos run a
partitioned agent went on delivering a batch 0.8 s after the new owner had started and checkpointed past it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from shardherd.agent.lease_keeper import LeaseKeeper, LossReason
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import TRIM_HORIZON
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings
from shardherd.shared.dynamo.store import DynamoLeaseStore
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


def test_partitioned_agent_is_told_to_stop_by_its_fencing_deadline(moto_server: MotoServer) -> None:
    clock = ManualClock()
    settings = load_settings(worker_id="w1", application_name=unique_app("fence"), failover_time_millis=2000)
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
        proxy.set(Chaos(partitioned=True))
        cut_at = clock.monotonic()  # the last successful heartbeat was sent no later than this
        while not told.lost and clock.monotonic() < cut_at + 30:
            clock.advance(0.1)
            keeper.tick()
        store.close()
    margin = max(0.2, settings.failover_time_millis / 1000 * 0.1)
    deadline = cut_at + settings.failover_time_millis / 1000 - margin
    assert told.lost and told.lost[0][1] is LossReason.SELF_FENCED
    assert told.lost[0][0] <= deadline + 0.1, f"told {told.lost[0][0] - deadline:.1f} s after the fencing deadline"
