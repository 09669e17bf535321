"""What a fault that stalls every reader costs in lease moves: figures from fault-matrix cells kept by bench.faults.

    python -m bench.outage_churn DIR [DIR ...]   # each DIR: a `bench.faults --keep` directory

For each kept cell (its `observed.pickle` and process logs): the owner changes while the fault lasted (lease-table
samples; the leases of the agent the cell killed 2 s in are left out, their move is failover), the leases agents gave
back for lack of progress (their logs' "giving it back" lines, agent/stall_watch.py), and the seconds from the heal
until every shard open at the fault's start was read again. Decision 0039 measured the fleet-wide Kinesis hang with
it, before and after agents kept stalled leases in a fleet-wide stall.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.chaos.analysis import owner_changes
from tests.chaos.matrix import OBSERVED, Observed

GIVEN_BACK = "; giving it back"  # the stall watch's log line for a lease it gives back


def figures(kept: Path) -> str:
    """One Markdown row for the cell kept in `kept`."""
    observed = Observed.load(kept / OBSERVED)
    heal = next((event.time for event in observed.data.events if event.kind == "heal"), observed.stopped)
    moves = owner_changes(observed.data.samples, observed.t0, heal, skip=_probed(observed))
    given = sum(path.read_text(encoding="utf-8", errors="replace").count(GIVEN_BACK)
                for path in sorted(kept.glob("agent-*.log")))
    read = _read_again(observed, heal)
    return f"| {observed.cell} | {heal - observed.t0:.1f} | {moves} | {given} | {_seconds(read)} |"


def _probed(observed: Observed) -> list[str]:
    """The leases the agent killed during the fault (the probe) read just before its kill."""
    kill = next((event.time for event in observed.data.events if event.kind == "kill"), None)
    before = [sample for sample in observed.data.samples if kill is not None and sample.time <= kill]
    if not before or observed.probe is None:
        return []
    return [key for key, row in before[-1].leases.items() if (row.checkpoint_owner or row.owner) == observed.probe]


def _read_again(observed: Observed, heal: float) -> float | None:
    """Seconds from the heal until every shard open at the fault's start delivered a record again; None: not all."""
    at_start = [sample for sample in observed.data.samples if sample.time <= observed.t0]
    if not at_start:
        return None
    shards = [key for key, row in at_start[-1].leases.items() if not row.checkpoint.is_shard_end]
    firsts = [min((d.time for d in observed.data.deliveries if d.shard == key and d.time > heal), default=None)
              for key in shards]
    found = [first for first in firsts if first is not None]
    return max(found) - heal if found and len(found) == len(firsts) else None


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def main(argv: list[str]) -> int:
    """Print the table for every kept cell under the given directories."""
    print("| cell | fault s | owner changes during the fault | leases given back | every shard read again after "
          "the heal, s |\n|---|---|---|---|---|")
    for base in argv:
        for cell in sorted(Path(base).glob(f"cell-*/{OBSERVED}")):
            print(figures(cell.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
