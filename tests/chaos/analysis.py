"""After-run checks and figures from the chaos run's ledgers, lease-table samples and fault events.

Pure functions over plain data (RunData), so the checks themselves are unit-tested on hand-made ledgers.
Times are wall seconds on this host; a skewed agent's ledger times are shifted back by its known skew first.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from tests.chaos.cluster import ChaosCluster, Event, Sample
from tests.chaos.ledgers import CheckpointMark, Delivery, Produced, read_checkpoints, read_deliveries

FENCING = "partitioned agents stop by their fencing deadline"
STARTUP_SECONDS = 3.0  # start-up assumed for an agent whose readiness was not observed (hand-made run data)


@dataclass(frozen=True)
class Timing:
    """The run's settings that the bounds derive from, in seconds."""

    failover: float
    interval: float
    sample_period: float
    split_gap: float = 2.5  # a worker's deliveries of a shard further apart than this are separate tenures

    @property
    def unowned_bound(self) -> float:
        """Longest a lease may stay unowned while a leader and a live worker exist: failover + 2 intervals."""
        return self.failover + 2 * self.interval + 2 * self.sample_period


@dataclass(frozen=True)
class Lifetime:
    """When a worker process ran and how it ended (kill, term, close)."""

    started: float
    ended: float | None
    how: str
    skew: float = 0.0
    ready: float | None = None  # observed: first heartbeat (and CPU report) the leader could use

    @property
    def ready_at(self) -> float:
        """When the worker became usable: observed, or start plus STARTUP_SECONDS when not observed."""
        return self.ready if self.ready is not None else self.started + STARTUP_SECONDS


@dataclass
class RunData:
    """Everything a run leaves behind."""

    deliveries: list[Delivery]
    checkpoints: list[CheckpointMark]
    produced: list[Produced]
    samples: list[Sample]
    events: list[Event]
    lifetimes: dict[str, Lifetime]
    parents: dict[str, tuple[str, ...]]
    timing: Timing

    @classmethod
    def collect(cls, cluster: ChaosCluster, timing: Timing) -> RunData:
        """Read a finished cluster's ledgers and logs, undoing each agent's wall-clock skew."""
        lifetimes = {m.name: Lifetime(m.started, m.ended, m.how, m.skew, m.ready) for m in cluster.members.values()}

        def skew(worker: str) -> float:
            return lifetimes[worker].skew if worker in lifetimes else 0.0

        deliveries = [replace(d, time=d.time - skew(d.worker)) for d in read_deliveries(cluster.workdir)]
        marks = [replace(c, time=c.time - skew(c.worker)) for c in read_checkpoints(cluster.workdir)]
        parents = {s.shard_id: s.parent_ids for s in cluster.shards()}
        return cls(deliveries, marks, cluster.producer.read(), list(cluster.samples), list(cluster.events),
                   lifetimes, parents, timing)


@dataclass(frozen=True)
class Check:
    """One pass/fail verdict with what it saw."""

    name: str
    ok: bool
    detail: str


@dataclass
class Report:
    """The checks and the figures (name -> observed values, one per fault of that kind)."""

    checks: list[Check] = field(default_factory=list)
    figures: dict[str, list[float]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return all(check.ok for check in self.checks)


# ---------------------------------------------------------------------------------------------- helpers
def _by_shard(deliveries: Iterable[Delivery]) -> dict[str, list[Delivery]]:
    shards: dict[str, list[Delivery]] = defaultdict(list)
    for delivery in deliveries:
        shards[delivery.shard].append(delivery)
    for rows in shards.values():
        rows.sort(key=lambda d: d.time)
    return shards


def tenures(times: list[float], gap: float, breaks: Sequence[float] = ()) -> list[tuple[float, float]]:
    """Sorted delivery times cut into [first, last] stretches at gaps over `gap` and at `breaks` between two times.

    A break is where another worker began a stint of its own on the shard (a handoff A -> B -> A).
    """
    spans: list[tuple[float, float]] = []
    for at in times:
        interrupted = spans and any(spans[-1][1] < cut < at for cut in breaks)
        if spans and at - spans[-1][1] <= gap and not interrupted:
            spans[-1] = (spans[-1][0], at)
        else:
            spans.append((at, at))
    return spans


# A worker that delivers at least this many records of a shard in a row had the shard for a stint of its own
# (a handoff A -> B -> A); fewer, interleaved with another worker's, is two workers reading at once.
STINT_RECORDS = 3


def stints_of_others(rows: list[Delivery], worker: str) -> list[float]:
    """Times at which another worker began a run of at least STINT_RECORDS consecutive deliveries of the shard."""
    starts: list[float] = []
    run_worker, run_start, run_length = "", 0.0, 0
    for delivery in [*rows, None]:
        if delivery is not None and delivery.worker == run_worker:
            run_length += 1
            continue
        if run_worker and run_worker != worker and run_length >= STINT_RECORDS:
            starts.append(run_start)
        if delivery is not None:
            run_worker, run_start, run_length = delivery.worker, delivery.time, 1
    return starts


def _partitions(events: list[Event]) -> dict[str, list[tuple[float, float]]]:
    """Per agent, the [start, end] of each partition (an unhealed one ends at infinity)."""
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    open_since: dict[str, float] = {}
    for event in sorted(events, key=lambda e: e.time):
        names = event.target.split(",") if event.target else []
        if event.kind == "partition":
            for name in names:
                open_since[name] = event.time
        elif event.kind in ("partition_end", "healed"):
            for name in names if event.kind == "partition_end" else list(open_since):
                if name in open_since:
                    spans[name].append((open_since.pop(name), event.time))
    for name, start in open_since.items():
        spans[name].append((start, float("inf")))
    return spans


def live_agents(data: RunData, at: float) -> list[str]:
    """Agents running (usable by the leader), not signalled to end and not partitioned at `at`."""
    cut = _partitions(data.events)
    return [name for name, life in data.lifetimes.items()
            if name.startswith("agent-") and life.ready_at <= at
            and (life.ended is None or at < life.ended)
            and not any(start <= at <= end for start, end in cut.get(name, []))]


def _owned_before(data: RunData, worker: str, at: float) -> list[str]:
    """Unfinished leases processed by `worker` in the last sample before `at`."""
    before = [s for s in data.samples if s.time <= at]
    if not before:
        return []
    return [key for key, row in before[-1].leases.items()
            if (row.checkpoint_owner or row.owner) == worker and not row.checkpoint.is_shard_end]


def _resumed_elsewhere(data: RunData, shards: dict[str, list[Delivery]], key: str, worker: str,
                       after: float) -> float | None:
    """When another worker first delivered a record of `key` after `after` (else first owned it elsewhere)."""
    for delivery in shards.get(key, []):
        if delivery.time > after and delivery.worker != worker:
            return delivery.time
    for sample in data.samples:
        row = sample.leases.get(key)
        if sample.time > after and row is not None and (row.checkpoint_owner or row.owner) not in (worker, None):
            return sample.time
    return None


# ---------------------------------------------------------------------------------------------- checks
def check_no_loss(data: RunData) -> Check:
    """Every produced record was delivered at least once."""
    delivered = {d.data for d in data.deliveries}
    missing = sorted(p.data for p in data.produced if p.data not in delivered)
    return Check("no loss", not missing and bool(data.produced),
                 f"{len(data.produced)} produced, {len(delivered)} distinct delivered, {len(missing)} missing "
                 f"{missing[:5]}")


def check_duplicates(data: RunData, report: Report) -> list[Check]:
    """Redeliveries only of records no accepted checkpoint covered yet, and none caused by a graceful stop."""
    marks: dict[str, list[tuple[float, tuple[int, int]]]] = defaultdict(list)
    for mark in sorted(data.checkpoints, key=lambda m: m.time):
        best = max(marks[mark.shard][-1][1], (mark.sequence, mark.sub)) if marks[mark.shard] else (
            mark.sequence, mark.sub)
        marks[mark.shard].append((mark.time, best))
    copies: dict[tuple[str, int, int], list[Delivery]] = defaultdict(list)
    for delivery in data.deliveries:
        copies[(delivery.shard, delivery.sequence, delivery.sub)].append(delivery)
    times = {shard: [t for t, _ in rows] for shard, rows in marks.items()}
    cut = _partitions(data.events)
    covered, graceful, total = [], [], 0
    for (shard, sequence, sub), rows in copies.items():
        rows.sort(key=lambda d: d.time)
        for previous, again in itertools.pairwise(rows):
            total += 1
            index = bisect.bisect_left(times.get(shard, []), again.time) - 1
            late_fence = any(start <= again.time <= end for start, end in cut.get(again.worker, []))
            if index >= 0 and marks[shard][index][1] >= (sequence, sub) and not late_fence:
                covered.append(again)  # (a partitioned worker's late deliveries are judged by check_fencing)
            life = data.lifetimes.get(previous.worker)
            if (life is not None and life.how == "term" and life.ended is not None and again.worker != previous.worker
                    and previous.time >= life.ended - data.timing.failover):
                graceful.append(again)
    report.counts["duplicates"] = total
    report.counts["graceful duplicates"] = len(graceful)
    return [Check("duplicates only after the last checkpoint", not covered,
                  f"{total} redeliveries, {len(covered)} of records a checkpoint already covered "
                  f"{[(d.shard, d.data, d.worker) for d in covered[:5]]}"),
            Check("no duplicates from graceful handoffs", not graceful,
                  f"{len(graceful)} {[(d.shard, d.data, d.worker) for d in graceful[:5]]}")]


def check_overlap(data: RunData, report: Report) -> list[Check]:
    """No shard processed by two workers at once beyond the failover time; never across a graceful handoff."""
    worst, worst_graceful, where = 0.0, 0.0, ""
    for shard, rows in _by_shard(data.deliveries).items():
        spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for worker in {d.worker for d in rows}:
            spans[worker] = tenures([d.time for d in rows if d.worker == worker], data.timing.split_gap,
                                    stints_of_others(rows, worker))
        workers = sorted(spans)
        for i, first in enumerate(workers):
            for second in workers[i + 1:]:
                for a_start, a_end in spans[first]:
                    for b_start, b_end in spans[second]:
                        overlap = min(a_end, b_end) - max(a_start, b_start)
                        if overlap <= 0:
                            continue
                        if overlap > worst:
                            worst, where = overlap, f"{shard}: {first} and {second}"
                        if any(data.lifetimes.get(w, Lifetime(0, None, "")).how == "term" for w in (first, second)):
                            worst_graceful = max(worst_graceful, overlap)
    report.figures["overlap s"] = [worst]
    return [Check("overlap within the failover time", worst <= data.timing.failover,
                  f"longest {worst:.2f} s {where} (bound {data.timing.failover:.1f} s)"),
            Check("no overlap at graceful handoffs", worst_graceful == 0.0, f"longest {worst_graceful:.2f} s")]


def check_fencing(data: RunData) -> Check:
    """A partitioned agent delivers nothing once the failover time has passed since the partition began."""
    late = []
    for worker, spans in _partitions(data.events).items():
        for start, end in spans:
            late += [d for d in data.deliveries
                     if d.worker == worker and start + data.timing.failover < d.time <= end]
    worst = max((d.time - start for d in late for start, _ in _partitions(data.events)[d.worker]
                 if d.time >= start), default=0.0)
    return Check(FENCING, not late, f"{len(late)} deliveries after the deadline, latest {worst:.2f} s into the "
                                    f"partition (bound {data.timing.failover:.1f} s)")


def check_checkpoints_monotonic(data: RunData) -> Check:
    """No sampled lease checkpoint ever moved backwards."""
    last: dict[str, object] = {}
    regressions = []
    for sample in data.samples:
        for key, row in sample.leases.items():
            previous = last.get(key)
            if previous is not None and row.checkpoint < previous:
                regressions.append(f"{key}: {previous} -> {row.checkpoint} at {sample.time:.1f}")
            last[key] = row.checkpoint
        for key in set(last) - set(sample.leases):
            del last[key]  # row deleted (finished lineage cleaned up): a new row may start again
    return Check("checkpoints never move backwards", not regressions and bool(data.samples),
                 f"{len(data.samples)} samples, {len(regressions)} regressions {regressions[:3]}")


def check_children_after_parents(data: RunData) -> Check:
    """No child shard's first delivery came before its parents' last one."""
    shards = _by_shard(data.deliveries)
    early, checked = [], 0
    for child, parents in data.parents.items():
        if not parents or not shards.get(child):
            continue
        checked += 1
        first = shards[child][0].time
        for parent in parents:
            if shards.get(parent) and shards[parent][-1].time > first:
                early.append(f"{child} at {first:.3f} before {parent} ended {shards[parent][-1].time:.3f}")
    return Check("children start after parents end", not early,
                 f"{checked} children read, {len(early)} early {early[:3]}")


def _leaderless(data: RunData) -> list[tuple[float, float]]:
    """From each coordinator kill to one interval after another holder shows in the lock."""
    spans = []
    for event in data.events:
        if event.kind == "kill" and event.target.startswith("coord-"):
            after = [s for s in data.samples if s.time > event.time and s.leader not in (None, event.target)]
            end = after[0].time if after else float("inf")
            spans.append((event.time - data.timing.sample_period, end + data.timing.interval))
    return spans


def check_unowned(data: RunData, report: Report) -> Check:
    """No ready lease unowned longer than failover + two leader intervals while a leader and a live worker exist."""
    gaps = _leaderless(data)
    run: dict[str, float] = defaultdict(float)
    worst, where = 0.0, ""
    for sample, following in itertools.pairwise(data.samples):
        watched = (sample.leader is not None and live_agents(data, sample.time)
                   and not any(start <= sample.time <= end for start, end in gaps))
        for key, row in sample.leases.items():
            ready = all(sample.leases[p].checkpoint.is_shard_end for p in row.parents if p in sample.leases)
            if watched and row.owner is None and ready and not row.checkpoint.is_shard_end:
                run[key] += following.time - sample.time
                if run[key] > worst:
                    worst, where = run[key], key
            else:
                run[key] = 0.0
    report.figures["longest unowned s"] = [worst]
    bound = data.timing.unowned_bound
    return Check("no lease unowned too long", worst <= bound, f"longest {worst:.2f} s ({where}), bound {bound:.1f} s")


# ---------------------------------------------------------------------------------------------- figures
def failover_figures(data: RunData, report: Report) -> None:
    """Agent kill / partition -> shards read elsewhere; leader kill -> new leader; SIGTERM -> per-shard gap."""
    shards = _by_shard(data.deliveries)
    for event in data.events:
        if event.kind in ("kill", "partition") and event.target.startswith("agent-"):
            worker = event.target
            keys = _owned_before(data, worker, event.time)
            resumed = [_resumed_elsewhere(data, shards, key, worker, event.time) for key in keys]
            if keys and all(at is not None for at in resumed):
                name = "agent kill -9 -> shards read elsewhere s" if event.kind == "kill" else \
                    "partition -> shards read elsewhere s"
                report.figures.setdefault(name, []).append(max(at for at in resumed if at is not None) - event.time)
            elif keys:
                report.counts["failovers not resumed"] = report.counts.get("failovers not resumed", 0) + 1
        elif event.kind == "kill" and event.target.startswith("coord-"):
            after = [s for s in data.samples if s.time > event.time and s.leader not in (None, event.target)]
            if after:
                report.figures.setdefault("leader kill -9 -> new leader s", []).append(after[0].time - event.time)
        elif event.kind == "term" and event.target.startswith("agent-"):
            for key in _owned_before(data, event.target, event.time):
                rows = shards.get(key, [])
                mine = [d.time for d in rows if d.worker == event.target]
                if not mine:
                    continue
                last = max(mine)
                nxt = [d.time for d in rows if d.time > last and d.worker != event.target]
                if nxt:
                    report.figures.setdefault("graceful drain gap per shard s", []).append(min(nxt) - last)


def analyse(data: RunData) -> Report:
    """Run every check and collect every figure."""
    report = Report()
    report.checks.append(check_no_loss(data))
    report.checks.extend(check_duplicates(data, report))
    report.checks.extend(check_overlap(data, report))
    report.checks.append(check_fencing(data))
    report.checks.append(check_checkpoints_monotonic(data))
    report.checks.append(check_children_after_parents(data))
    report.checks.append(check_unowned(data, report))
    failover_figures(data, report)
    faults: dict[str, int] = defaultdict(int)
    for event in data.events:
        faults[event.kind] += 1
    report.counts.update({f"event {kind}": count for kind, count in sorted(faults.items())})
    return report


def summary(values: list[float]) -> str:
    """min / median / p90 / max of a distribution, with its size."""
    if not values:
        return "no samples"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (f"n={len(ordered)} min={ordered[0]:.2f} median={statistics.median(ordered):.2f} p90={p90:.2f} "
            f"max={ordered[-1]:.2f}")


def format_report(report: Report) -> str:
    """The report as text: checks, figures as distributions, counts."""
    lines = ["checks:"]
    lines += [f"  [{'PASS' if c.ok else 'FAIL'}] {c.name}: {c.detail}" for c in report.checks]
    lines.append("figures:")
    lines += [f"  {name}: {summary(values)}" for name, values in sorted(report.figures.items())]
    lines.append("counts:")
    lines += [f"  {name}: {count}" for name, count in sorted(report.counts.items())]
    return "\n".join(lines)


def owner_changes(samples: Sequence[Sample], since: float, until: float, skip: Iterable[str] = ()) -> int:
    """How often a lease's processing worker changed between lease-table samples within [since, until].

    `skip` names leases not counted (those of an agent the harness killed meanwhile: their move is failover).
    """
    skipped = set(skip)
    window = [sample for sample in samples if since <= sample.time <= until]
    changes = 0
    for before, after in itertools.pairwise(window):
        for key, row in after.leases.items():
            old = before.leases.get(key)
            if key not in skipped and old is not None and (
                    (old.checkpoint_owner or old.owner) != (row.checkpoint_owner or row.owner)):
                changes += 1
    return changes
