"""When the leader scans: rarely while every live worker listens and nothing is pending, at once on a signal."""

from __future__ import annotations

from shardherd.coordinator.scan_policy import (
    CADENCE,
    FIRST,
    LEASE_MODE,
    NO_WORKERS,
    ViewState,
    pending_in,
    scan_reason,
)

QUIET = ViewState(scanned_at=100.0, roster=frozenset({"w1", "w2"}), pending=None)


def _reason(view: ViewState | None = QUIET, now: float = 105.0, lease_mode: bool = False,
            listening: frozenset[str] = frozenset({"w1", "w2"}),
            signals: tuple[tuple[str, str], ...] = ()) -> str | None:
    return scan_reason(view, now, 20.0, lease_mode, lambda worker: worker in listening, signals)


def test_a_quiet_view_with_every_live_worker_listening_stands_until_the_full_scan_interval() -> None:
    assert _reason() is None
    assert _reason(now=119.9) is None
    assert _reason(now=120.0) == CADENCE


def test_anything_needing_watching_scans_every_tick() -> None:
    assert _reason(view=None) == FIRST
    assert _reason(lease_mode=True) == LEASE_MODE
    assert _reason(view=ViewState(100.0, QUIET.roster, "2 handoffs in flight")) == "2 handoffs in flight"
    assert _reason(listening=frozenset({"w1"})) == "not on the channel: w2"
    assert _reason(signals=(("w2", "dropped"), ("w1", "news"))) == "dropped: w2"
    assert _reason(view=ViewState(100.0, frozenset(), None)) == NO_WORKERS


def test_pending_names_the_first_thing_that_needs_watching() -> None:
    assert pending_in(0, 0, 0, (), False, False) is None
    assert pending_in(3, 2, 0, (), False, False) == "3 leases without a live owner"
    assert pending_in(0, 2, 1, (), False, False) == "2 handoffs in flight"
    assert pending_in(0, 0, 1, (), False, False) == "1 writes lost their race"
    assert pending_in(0, 0, 0, ("w9", "w3"), False, False) == "liveness not yet decided: w3"
    assert pending_in(0, 0, 0, (), True, False) == "shard sync changed leases"
    assert pending_in(0, 0, 0, (), False, True) == "balancing moved leases in its last pass"
