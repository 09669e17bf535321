"""A worker joining a just-placed fleet is filled at once (issue 31; `LeaseView.fresh`).

Live (`shardherd up --no-spark --shards 64 --agents 8`): the first placing run spread the 64 leases over the 5 agents
whose rows the leader had seen; the 3 that came later held nothing for 14 s, because every giver's lease figures were
still rising from 0 (settling) and band gives nothing from a worker it cannot price (band_moves.py invariant 1). A
lease placed in this term whose figure never settled costs nothing any report shows, so the fill on shares may move
it on.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from shardherd.coordinator.decide import decide
from shardherd.coordinator.decider_config import DeciderConfig
from shardherd.coordinator.snapshot import LeaseView, Snapshot, WorkerView

K = 0.2  # CPU points per KiB/s


def _just_placed(fresh: bool, holders: int = 5, joiners: int = 3, shards: int = 64) -> Snapshot:
    """`holders` workers hold every lease round robin, each figure still rising (settling); `joiners` hold none."""
    wids = [f"agent-{i}" for i in range(1, holders + joiners + 1)]
    leases = [LeaseView(f"shardId-{i:012d}", wids[i % holders], throughput_kbps=4.0 + i % 3, settling=True,
                        fresh=fresh) for i in range(shards)]
    carried = _carried(leases)
    return Snapshot.of(leases, [WorkerView(w, {"C": (2.0 + K * carried.get(w, 0.0),) * 2}, {"C": (80.0,)})
                                for w in wids])


def _carried(leases: list[LeaseView]) -> dict[str, float]:
    carried: dict[str, float] = {}
    for lease in leases:
        carried[lease.lease_owner or ""] = carried.get(lease.lease_owner or "", 0.0) + (lease.throughput_kbps or 0.0)
    return carried


def _held(snapshot: Snapshot, plan_moves: dict[str, str]) -> Counter[str]:
    held = Counter({w.worker_id: 0 for w in snapshot.workers})
    held.update(plan_moves.get(lease.key, lease.lease_owner or "") for lease in snapshot.leases)
    return held


def test_joiners_into_a_just_placed_fleet_get_their_share_in_the_run_that_counts_them() -> None:
    snapshot = _just_placed(fresh=True)
    plan = decide(snapshot, DeciderConfig(), balance=True)
    held = _held(snapshot, {move.lease_key: move.to_worker for move in plan.moves})
    assert any("filling on T" in note for note in plan.notes), plan.notes
    # A share: at least three quarters of the average count (64 / 8 = 8 each), as bench.fleet_noise --joins counts it.
    assert min(held[f"agent-{i}"] for i in (6, 7, 8)) >= 6 and max(held.values()) <= 10, held


def test_leases_whose_figure_settled_once_are_priced_first() -> None:
    """The same fleet with leases not placed in this term (or settled since): the settling givers give nothing."""
    snapshot = _just_placed(fresh=False)
    assert decide(snapshot, DeciderConfig(), balance=True).moves == ()


def test_once_filled_the_fleet_moves_nothing_while_the_figures_settle() -> None:
    """The plan applied (every lease still fresh and settling): the next run moves nothing."""
    snapshot = _just_placed(fresh=True)
    plan = decide(snapshot, DeciderConfig(), balance=True)
    to = {move.lease_key: move.to_worker for move in plan.moves}
    leases = [dataclasses.replace(lease, lease_owner=to.get(lease.key, lease.lease_owner)) for lease in snapshot.leases]
    carried = _carried(leases)
    workers = [dataclasses.replace(w, metric_stats={"C": (2.0 + K * carried.get(w.worker_id, 0.0),) * 2})
               for w in snapshot.workers]
    again = decide(Snapshot.of(leases, workers), DeciderConfig(), balance=True)
    assert again.moves == (), again.moves
