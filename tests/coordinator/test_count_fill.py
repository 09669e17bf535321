"""Joining workers hold a share of lease counts when the fleet's throughput is within the noise margin (decision 0042).

Live (bench/scale.py: 256 shards, 32 plain agents joining over about 40 s, 500 records/s in all), 17 agents took
every lease and the 15 that joined later held none for the whole run: about 1 KiB/s per agent is under twice the
0.5 KiB/s minimum gain, so the fill on throughput (coordinator/deciders/band.py) counted an empty worker as inside
its band. The fleets here follow the load model exactly (CPU = k x carried KiB/s), so each next run's reports are
what the plan projected (tests/coordinator/test_decider_properties.py `replanned`).
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from shardherd.coordinator.decide import decide
from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.moves import MoveReason
from shardherd.coordinator.snapshot import LeaseView, Snapshot, WorkerView
from tests.coordinator.test_decider_properties import replanned


def _fleet(kbps: list[float], holders: int, joiners: int, k: float) -> Snapshot:
    """`holders` workers hold the leases round robin, `joiners` hold none; each reports CPU k x carried KiB/s."""
    wids = [f"w{i:02d}" for i in range(holders + joiners)]
    leases = [LeaseView(f"shardId-{i:012d}", wids[i % holders], throughput_kbps=rate) for i, rate in enumerate(kbps)]
    carried: dict[str, float] = dict.fromkeys(wids, 0.0)
    for lease in leases:
        carried[lease.lease_owner or ""] += lease.throughput_kbps or 0.0
    return Snapshot.of(leases, [WorkerView(w, {"C": (k * carried[w],) * 2}, {"C": (100.0,)}) for w in wids])


def _counts(snapshot: Snapshot) -> Counter[str]:
    held = Counter({w.worker_id: 0 for w in snapshot.workers})
    held.update(lease.lease_owner for lease in snapshot.leases if lease.lease_owner)
    return held


@settings(max_examples=60, deadline=None)
@given(holders=st.integers(1, 12), joiners=st.integers(1, 12), per_worker=st.integers(1, 12),
       kbps=st.floats(0.001, 0.04), k=st.sampled_from([0.001, 0.01, 0.04, 5.0]))
def test_joiners_hold_about_their_share_of_leases_at_tiny_load(holders: int, joiners: int, per_worker: int,
                                                               kbps: float, k: float) -> None:
    """Within two balancing runs every joiner holds about its share, and the plan planned again moves nothing.

    At most 12 x 0.12 KiB/s per worker: an empty worker is inside the throughput band's floor (twice the 0.5 KiB/s
    minimum gain is more than half an average share). Above that the fill stays on throughput (test below).

    With k up to 0.04 every worker's CPU stays under 4 points (the CPU band's half width): the CPU cannot tell the
    workers apart either. With k = 5 it can: load balancing decides, and the count fill must not fight it. (A fleet
    with no throughput at all balances lease counts in the band pass itself, with a floor of half the average.)
    """
    workers = holders + joiners
    snapshot = _fleet([kbps * (1 + i % 3) for i in range(per_worker * workers)], holders, joiners, k)
    config = DeciderConfig()
    for _ in range(2):  # within two balancing runs
        snapshot = replanned(snapshot, decide(snapshot, config, balance=True))
    held = _counts(snapshot)
    if k < 1:  # a joiner holds at least three quarters of the average count, rounded down
        assert min(held[f"w{i:02d}"] for i in range(holders, workers)) >= (3 * per_worker) // 4, held
    assert decide(snapshot, config, balance=True).moves == ()


def test_the_live_scale_run_fills_every_joiner_in_one_run() -> None:
    """17 agents hold 256 leases of about 0.1 KiB/s, 15 join: the run that counts them gives each 7 of its 8."""
    snapshot = _fleet([0.05 + 0.1 * (i % 3) for i in range(256)], 17, 15, 1.0)
    plan = decide(snapshot, DeciderConfig(), balance=True)
    assert {move.reason for move in plan.moves} == {MoveReason.BALANCE_THROUGHPUT}
    assert any("filling on lease count" in note for note in plan.notes)
    held = _counts(replanned(snapshot, plan))
    assert sorted(held.values())[:15] == [7] * 15 and max(held.values()) <= 9
    assert decide(replanned(snapshot, plan), DeciderConfig(), balance=True).moves == ()


def test_throughput_that_tells_workers_apart_is_filled_on_throughput() -> None:
    """At 3 KiB/s per worker an empty worker is under the throughput band's floor: the fill stays on throughput."""
    snapshot = _fleet([3.0] * 8, 3, 1, 1.0)
    plan = decide(snapshot, DeciderConfig(), balance=True)
    assert plan.moves and any("filling on T" in note for note in plan.notes)
