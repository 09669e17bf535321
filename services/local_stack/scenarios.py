"""Scenario commands against a running stack; each prints what happened and how long it took.

Times are measured here, from the moment the action was taken, by polling the operator API (lease owners and the
owners' heartbeats, which carry records processed per lease since the owner took it). A shard counts as "resumed"
once a new owner holds it outside any handoff and has reported records for it; a shard that held no record when the
action was taken (nothing checkpointed and nothing from TRIM_HORIZON) has nothing to report, and counts once a new
owner holds it outside any handoff.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from shardherd.services.local_stack.control import request
from shardherd.services.local_stack.state import StackState
from shardherd.services.local_stack.status import Snapshot, read_snapshot
from shardherd.services.status_cli import ApiError, OperatorClient
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import INITIAL_SENTINELS
from shardherd.shared.errors import ShardherdError

POLL_SECONDS = 0.25
Say = Callable[[str], None]


class ScenarioFailed(ShardherdError):
    """The scenario could not be carried out, or its effect did not show within the time limit."""


@dataclass(frozen=True)
class Outcome:
    """One measured effect: which lease (or worker) reached which state on whom after how many seconds."""

    subject: str
    where: str | None
    seconds: float | None  # None: not seen within the time limit


class Scenarios:
    """The scenario commands; `say` prints a line (the test collects them)."""

    def __init__(self, state: StackState, timeout: float, say: Say = print) -> None:
        self.state = state
        self.timeout = timeout
        self.say = say

    def snapshot(self) -> Snapshot:
        """The operator API's view; ScenarioFailed when no replica answers."""
        found = read_snapshot(self.state.api_urls())
        if found is None:
            raise ScenarioFailed(f"no coordinator API answers ({', '.join(self.state.api_urls())})")
        return found

    def _leases(self) -> dict[str, dict[str, Any]]:
        return {lease["lease_key"]: lease for lease in self.snapshot().unfinished}

    def _follow(self, keys: list[str], done: Callable[[dict[str, Any]], bool], verb: str,
                started: float) -> list[Outcome]:
        """Wait until `done(lease)` for each key, printing each as it happens; unmet ones are reported at the end."""
        pending = set(keys)
        outcomes: list[Outcome] = []
        while pending and time.monotonic() - started < self.timeout:
            leases = self._leases()
            for key in sorted(pending):
                lease = leases.get(key)
                if lease is not None and done(lease):
                    elapsed = time.monotonic() - started
                    outcomes.append(Outcome(key, lease["owner"], elapsed))
                    self.say(f"{key} {verb} on {lease['owner']} after {elapsed:.1f} s")
                    pending.discard(key)
            time.sleep(POLL_SECONDS)
        for key in sorted(pending):
            outcomes.append(Outcome(key, None, None))
            self.say(f"{key} not {verb} within {self.timeout:.0f} s")
        return outcomes

    def kill_agent(self, name: str | None) -> list[Outcome]:
        """SIGKILL an agent (default: the one holding most leases); report when each of its shards resumes."""
        leases = self._leases()
        if name is None:
            agents = [entry.name for entry in self.state.by_role("agent")]
            if not agents:
                raise ScenarioFailed("the stack has no running agent")
            name = max(agents, key=lambda agent: sum(1 for lease in leases.values() if _processor(lease) == agent))
        victim = name
        held = sorted(key for key, lease in leases.items() if _processor(lease) == victim)
        empty = self._empty({key: leases[key] for key in held})
        request(self.state.control_socket, "kill", name=victim, signal="SIGKILL")
        started = time.monotonic()
        self.say(f"killed {victim} (SIGKILL); it held {len(held)} leases: {', '.join(held) or 'none'}"
                 + (f" ({len(empty)} of them on shards without a record)" if empty else ""))
        return self._follow(held, lambda lease: _resumed(lease, {victim}, lease["lease_key"] in empty), "resumed",
                            started)

    def _empty(self, leases: dict[str, dict[str, Any]]) -> set[str]:
        """The keys of `leases` whose shard holds no record: never checkpointed, and nothing from TRIM_HORIZON."""
        initial = {sentinel.value for sentinel in INITIAL_SENTINELS}
        unread = {key: lease for key, lease in leases.items() if lease["checkpoint"] in initial}
        if not unread:
            return set()
        kinesis = self._kinesis()
        return {key for key, lease in unread.items()
                if not holds_records(kinesis, lease["stream"] or self.state.stream_name, lease["shard_id"])}

    def add_agent(self, watch: float) -> list[Outcome]:
        """Start one more agent; report its first heartbeat, then (within `watch` s) its first records, if any.

        The leader moves leases to the newcomer only when that improves the balance, so getting none is no failure.
        """
        name = str(request(self.state.control_socket, "add-agent")["name"])
        started = time.monotonic()
        self.say(f"started {name}")
        seen: float | None = None
        while seen is None and time.monotonic() - started < self.timeout:
            if any(worker["worker_id"] == name for worker in self.snapshot().workers):
                seen = time.monotonic() - started
                self.say(f"{name} heartbeating after {seen:.1f} s")
            time.sleep(POLL_SECONDS)
        outcomes = [Outcome(name, name if seen is not None else None, seen)]
        while seen is not None and time.monotonic() - started < seen + watch:
            mine = [lease for lease in self._leases().values() if _processor(lease) == name]
            if any(_resumed(lease, set()) for lease in mine):
                elapsed = time.monotonic() - started
                self.say(f"{name} processing records after {elapsed:.1f} s; holds {len(mine)} leases: "
                         f"{', '.join(sorted(lease['lease_key'] for lease in mine))}")
                return outcomes
            time.sleep(POLL_SECONDS)
        self.say(f"no lease moved to {name} within {watch:.0f} s: the leader saw no imbalance worth a move "
                 "(`shardherd plan` shows its view)")
        return outcomes

    def kill_leader(self) -> list[Outcome]:
        """SIGKILL the leading coordinator replica; report when another replica leads."""
        old = self.snapshot().leader
        if old is None or old not in {entry.name for entry in self.state.by_role("coordinator")}:
            raise ScenarioFailed(f"the leader ({old}) is not a coordinator of this stack")
        request(self.state.control_socket, "kill", name=old, signal="SIGKILL")
        started = time.monotonic()
        self.say(f"killed leader {old} (SIGKILL)")
        self.state.processes = [entry for entry in self.state.processes if entry.name != old]
        while time.monotonic() - started < self.timeout:
            found = read_snapshot(self.state.api_urls())
            if found is not None and found.leader not in (None, old):
                elapsed = time.monotonic() - started
                self.say(f"{found.leader} leads (epoch {found.epoch}) after {elapsed:.1f} s")
                return [Outcome("leader", found.leader, elapsed)]
            time.sleep(POLL_SECONDS)
        self.say(f"no new leader within {self.timeout:.0f} s")
        return [Outcome("leader", None, None)]

    def drain(self, worker: str) -> list[Outcome]:
        """Ask the leader to move every lease off `worker`; report when each resumes elsewhere."""
        held = sorted(key for key, lease in self._leases().items() if _processor(lease) == worker)
        client = OperatorClient(self.state.api_urls(), self.state.api_token())
        try:
            client.call("POST", f"/v1/workers/{quote(worker, safe='')}/drain")
        except ApiError as exc:
            raise ScenarioFailed(f"drain of {worker} failed: {exc}") from exc
        finally:
            client.close()
        started = time.monotonic()
        self.say(f"drain requested for {worker}; it holds {len(held)} leases: {', '.join(held) or 'none'}")
        return self._follow(held, lambda lease: _resumed(lease, {worker}), "resumed", started)

    def split(self, shard: str) -> list[Outcome]:
        """Split `shard` at the middle of its hash range; report when both children are read."""
        kinesis = self._kinesis()
        description = kinesis.describe_stream(StreamName=self.state.stream_name)["StreamDescription"]
        ranges = {item["ShardId"]: item["HashKeyRange"] for item in description["Shards"]}
        if shard not in ranges:
            raise ScenarioFailed(f"{shard} is not a shard of {self.state.stream_name}")
        low, high = int(ranges[shard]["StartingHashKey"]), int(ranges[shard]["EndingHashKey"])
        kinesis.split_shard(StreamName=self.state.stream_name, ShardToSplit=shard,
                            NewStartingHashKey=str((low + high) // 2 + 1))
        return self._children_of({shard}, "split")

    def merge(self, first: str, second: str) -> list[Outcome]:
        """Merge two adjacent shards; report when the child is read."""
        kinesis = self._kinesis()
        kinesis.merge_shards(StreamName=self.state.stream_name, ShardToMerge=first, AdjacentShardToMerge=second)
        return self._children_of({first, second}, "merge")

    def _children_of(self, parents: set[str], what: str) -> list[Outcome]:
        started = time.monotonic()
        self.say(f"{what} of {', '.join(sorted(parents))} requested")
        children: list[str] = []
        while not children and time.monotonic() - started < self.timeout:
            children = sorted(key for key, lease in self._leases().items()
                              if parents & set(lease["parent_shard_ids"]))
            time.sleep(POLL_SECONDS)
        if not children:
            raise ScenarioFailed(f"no child lease of {', '.join(sorted(parents))} within {self.timeout:.0f} s")
        self.say(f"child leases {', '.join(children)} created after {time.monotonic() - started:.1f} s")
        return self._follow(children, lambda lease: _resumed(lease, set()), "reading", started)

    def hot_shard(self, shard: str, rate: float, watch: float) -> list[Outcome]:
        """Send `rate` extra records/s to `shard`; for `watch` s report its throughput and every lease move."""
        request(self.state.control_socket, "hot-shard", shard=shard, rate=rate)
        started = time.monotonic()
        self.say(f"{shard} gets {rate:.0f} extra records/s")
        owners = {key: _processor(lease) for key, lease in self._leases().items()}
        outcomes: list[Outcome] = []
        peak = 0.0
        while time.monotonic() - started < watch:
            time.sleep(POLL_SECONDS * 4)
            leases = self._leases()
            peak = max(peak, (leases.get(shard) or {}).get("throughput_kbps") or 0.0)
            for key, lease in leases.items():
                now = _processor(lease)
                if key in owners and now != owners[key] and now is not None:
                    elapsed = time.monotonic() - started
                    self.say(f"leader moved {key}: {owners[key]} -> {now} after {elapsed:.1f} s")
                    outcomes.append(Outcome(key, now, elapsed))
                owners[key] = now
        self.say(f"{shard} peaked at {peak:.1f} KiB/s; {len(outcomes)} moves in {watch:.0f} s")
        if not outcomes:
            self.say(f"why no move: {self._why_no_moves()}")
        if rate > 0:
            self.say(f"the extra {rate:.0f} records/s to {shard} keep running; "
                     f"`scenario hot-shard {shard} --rate 0` ends them")
        return outcomes

    def _why_no_moves(self) -> str:
        """What the leader's dry run says now, and the persistence window a move waits for."""
        client = OperatorClient(self.state.api_urls(), self.state.api_token())
        try:
            plan = client.call("POST", "/v1/plan")
        except ApiError as exc:
            return f"the leader's plan could not be read ({exc})"
        finally:
            client.close()
        window = ("balancing acts on a worker's load only once every report of rebalance_persistence_millis "
                  "(30 s by default) showed it (decision 0013)")
        if plan["moves"]:
            return f"the leader's plan now has {len(plan['moves'])} moves, for its next balancing run; {window}"
        notes = "; ".join(plan["notes"]) or ("balanced" if plan["balanced"] else "no move lowers a peak enough")
        return f"the leader's plan now moves nothing ({notes}); {window}"

    def _kinesis(self) -> Any:
        return make_client("kinesis", self.state.region, self.state.kinesis_endpoint_url)


def holds_records(kinesis: Any, stream: str, shard: str) -> bool:
    """Whether the shard holds any record (one GetRecords of one record from TRIM_HORIZON)."""
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard,
                                          ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    return bool(kinesis.get_records(ShardIterator=iterator, Limit=1)["Records"])


def _processor(lease: dict[str, Any]) -> str | None:
    """The worker reading the lease now (the checkpoint owner during a handoff)."""
    owner: str | None = lease["checkpoint_owner"] or lease["owner"]
    return owner


def _resumed(lease: dict[str, Any], not_on: set[str], empty: bool = False) -> bool:
    """Held outside a handoff by a worker not in `not_on`, which reported records for it (or it has none to read)."""
    return (lease["owner"] is not None and lease["owner"] not in not_on and lease["checkpoint_owner"] is None
            and (empty or (lease["records_processed"] or 0) > 0))
