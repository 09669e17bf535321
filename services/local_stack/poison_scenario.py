"""`scenario poison`: one record the plain agents' processor rejects, put into a running stack; timed and counted.

Invariants (decision 0031, "Poison records"):
- Plain agents only. A Spark stack is refused with one line before anything is written: Spark agents do not bisect
  batches or quarantine records (docs/spark.md); the record would make the query fail on every micro-batch.
- The poison record is what the stack's producer never writes (not a JSON object with n, key and t:
  services/local_stack/processor.py rejects it), put into one shard through its starting hash key.
- Everything is counted, not assumed: the records the agents delivered come from their key files, the stream's
  records from the emulator, the quarantined copy from the destination. Under `block` the shard must deliver nothing
  after the record (0 skipped) and the API must name it; the scenario then takes the operator's path (rewind
  `--to-sequence` past it) so the stack keeps running. Under `quarantine` every other record must be delivered, the
  record must be in the destination once and not in the output.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardherd.agent.quarantine import open_destination
from shardherd.coordinator.rewind_probe import unthrottled
from shardherd.services.local_stack.control_scenarios import ControlScenarios, sink_counts, stream_keys
from shardherd.services.local_stack.processor import KEYS_SUFFIX
from shardherd.services.local_stack.scenarios import Outcome, ScenarioFailed
from shardherd.services.local_stack.state import LOG_DIR
from shardherd.services.status_cli import ApiError
from shardherd.shared.clock import SystemClock
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.shard_lister import list_shards

POISON_DATA = b"not a producer record: scenario poison"
WATCH_BLOCKED_SECONDS = 3.0  # how long a blocked shard is watched delivering nothing after the record
LOGGED = ("bisecting the", "poison record")  # the agents' log lines that say when each step happened
LOG_LINES = 6  # of them, printed (a blocked shard logs each retry)


class KeyTail:
    """Reads one shard's new lines of every agent's key file as they grow: the newest sequence number delivered."""

    def __init__(self, directory: Path, shard: str) -> None:
        self._directory = directory
        self._shard = shard
        self._offsets: dict[Path, int] = {}
        self.newest = -1

    def read(self) -> int:
        """The largest sequence number delivered so far (-1: none)."""
        for path in self._directory.glob(f"*/{self._shard}{KEYS_SUFFIX}"):
            with path.open("rb") as keys:
                keys.seek(self._offsets.get(path, 0))
                chunk = keys.read()
            complete = chunk[:chunk.rfind(b"\n") + 1]
            self._offsets[path] = self._offsets.get(path, 0) + len(complete)
            for line in complete.decode("ascii").splitlines():  # "SEQUENCE SUB"
                if line:
                    self.newest = max(self.newest, int(line.split()[0]))
        return self.newest


class PoisonScenario:
    """Puts a poison record into a shard of the stack `controls` acts on and follows what the agents do with it."""

    def __init__(self, controls: ControlScenarios) -> None:
        self.controls = controls
        self.base = controls.base
        self.say = controls.say
        self.state = controls.base.state
        self.sequence: str | None = None  # the poison record's sequence number, once put

    def run(self, lease_key: str | None) -> list[Outcome]:
        """Put the record, then follow the policy's course; one Outcome per effect (seconds None: not seen)."""
        if self.state.spark:
            raise ScenarioFailed("scenario poison needs plain agents (`shardherd up --no-spark`): Spark agents do not "
                                 "bisect batches or quarantine records (docs/spark.md)")
        if not self.controls.counting:
            raise ScenarioFailed(f"no record keys under {self.controls.records}: is this a `--no-spark` stack?")
        key = lease_key or self._busiest()
        shard = self.controls._row(key).shard
        tail = KeyTail(self.controls.records, shard)
        tail.read()
        sequence, arrived = self._put(shard)
        self.sequence = sequence
        where = f"{sequence}/0"
        destination = self.state.poison_destination
        self.say(f"put a poison record into {shard} at {time.strftime('%H:%M:%S', time.localtime(arrived))}: "
                 f"{where}, {POISON_DATA!r} (the plain agents' processor rejects what the producer does not write); "
                 f"policy {self.state.poison_policy}" + (f", destination {destination}" if destination else "")
                 + "; times from the put")
        if self.state.poison_policy == "quarantine" and destination is not None:
            return self._quarantined(key, shard, sequence, arrived, tail, destination)
        return self._blocked(key, shard, sequence, arrived, tail)

    def _busiest(self) -> str:
        """The unfinished lease with the most records per second (a poison record in a quiet shard shows little)."""
        leases = self.base.snapshot().unfinished
        if not leases:
            raise ScenarioFailed("no unfinished lease")
        return str(max(leases, key=lambda lease: (lease.get("records_per_second") or 0.0, lease["lease_key"]))
                   ["lease_key"])

    def _put(self, shard: str) -> tuple[str, float]:
        """Put POISON_DATA into `shard` (its starting hash key); its sequence number and the wall time it was put."""
        kinesis = self.base._kinesis()
        shards = {found.shard_id: found for found in list_shards(kinesis, self.state.stream_name, RetryPolicy())}
        if shard not in shards:
            raise ScenarioFailed(f"{shard} is not a shard of {self.state.stream_name}")
        # A shard at its write limit (a hot-shard load just ended) refuses for a moment: asked again, as AWS wants.
        answer = unthrottled(lambda: kinesis.put_record(StreamName=self.state.stream_name, Data=POISON_DATA,
                                                        PartitionKey="poison",
                                                        ExplicitHashKey=shards[shard].starting_hash_key),
                             SystemClock())
        if answer["ShardId"] != shard:
            raise ScenarioFailed(f"the record went to {answer['ShardId']}, not {shard}")
        return str(answer["SequenceNumber"]), time.time()

    def _poison_entry(self, key: str) -> dict[str, Any] | None:
        """The coordinator API's poison summary of `key` (GET /v1/poison), if it lists it."""
        client = self.controls._client()
        try:
            items = client.call("GET", "/v1/poison")["items"]
        except ApiError:
            return None  # a replica restarting: asked again at the next poll
        finally:
            client.close()
        return next((item for item in items if item["lease_key"] == key), None)

    def _until(self, what: str, since: float, done: Callable[[], bool]) -> float | None:
        """Seconds from `since` (wall time: the put) until `done()`, said; None (said) if not within the timeout."""
        return self.controls._wait(what, time.monotonic() - (time.time() - since), done)

    def _blocked(self, key: str, shard: str, sequence: str, arrived: float, tail: KeyTail) -> list[Outcome]:
        """Policy block: the API names the record, nothing after it is delivered; then rewound past it."""
        where = f"{sequence}/0"
        entry: dict[str, Any] = {}

        def named() -> bool:
            entry.update(self._poison_entry(key) or {})
            return entry.get("blocked_on") == where

        seconds = self._until(f"{key} blocked on {where} (bisected down to it) and named by the API", arrived, named)
        outcomes = [Outcome(f"{key} blocked", entry.get("owner"), seconds)]
        if seconds is None:
            return outcomes
        self.say(f"the alert: shard {shard} stuck on poison record {where}, last error: {entry.get('error')}")
        self._logged(key, sequence)
        time.sleep(WATCH_BLOCKED_SECONDS)
        after = tail.read() > int(sequence)
        missing = self._missing(key, sequence, before_only=True)
        self.say(f"{shard}: records after the poison one delivered while blocked: {'some' if after else 0}; records "
                 f"before it missing from the output: {missing}")
        if after or missing:
            outcomes.append(Outcome(f"{key} skipped or lost records", None, None))
        self.controls._call("/v1/rewind", to_sequence=[f"{key}={sequence}"], who="scenario poison")
        asked = time.time()
        self.say(f"rewound {key} past it (`shardherd rewind --to-sequence {key}={sequence}`)")
        resumed = self._until(f"{shard}: the next record delivered", arrived,
                              lambda: tail.read() > int(sequence))
        if resumed is not None:
            self.say(f"  ({resumed - (asked - arrived):.1f} s after the rewind)")
        return [*outcomes, Outcome(f"{key} resumed", None, resumed)]

    def _quarantined(self, key: str, shard: str, sequence: str, arrived: float, tail: KeyTail,
                     url: str) -> list[Outcome]:
        """Policy quarantine: the record in the destination once, the shard delivers on, every other record too."""
        destination = open_destination(url, self.state.region, os.environ.get("SHARDHERD_S3_ENDPOINT_URL"))
        name = f"{self.state.stream_name}/{shard}/{sequence}-00000.json"
        stored = self._until(f"{sequence}/0 quarantined to {url}/{name}", arrived,
                             lambda: name in set(destination.names()))
        delay = self._until(f"{shard}: the next record delivered (the shard's delay)", arrived,
                            lambda: tail.read() > int(sequence))
        entry: dict[str, Any] = {}

        def listed() -> bool:
            entry.update(self._poison_entry(key) or {})
            return entry.get("last_quarantined") == f"{sequence}/0"

        shown = self._until("/v1/poison lists it", arrived, listed)
        if shown is not None:
            self.say(f"  /v1/poison: {key} on {entry.get('owner')}: {entry.get('quarantined')} quarantined, last "
                     f"{entry.get('last_quarantined')} -> {entry.get('last_object')}")
        self._logged(key, sequence)
        outcomes = [Outcome(f"{key} quarantined", entry.get("owner"), stored), Outcome(f"{key} delay", None, delay),
                    Outcome(f"{key} listed", None, shown)]
        if stored is None or delay is None:
            return outcomes
        copies = [found for found in destination.names() if found.endswith(f"/{sequence}-00000.json")]
        same = len(copies) == 1 and base64.b64decode(destination.get(copies[0]).data) == POISON_DATA
        missing = self._missing(key, sequence, before_only=False)
        self.say(f"the destination holds it {len(copies)} time(s){'' if same else ' (NOT as put)'}; {shard}: every "
                 f"other record up to its checkpoint delivered, {missing} missing; the poison record in the output: "
                 f"{'yes' if self._delivered(shard, sequence) else 'no'}")
        if not same or missing or self._delivered(shard, sequence):
            outcomes.append(Outcome(f"{key} counts", None, None))
        return outcomes

    def _missing(self, key: str, sequence: str, before_only: bool) -> int:
        """Records of the lease's shard missing from the output (never the poison record itself).

        Those before the poison record (`before_only`), else every one up to the lease's checkpoint.
        """
        row = self.controls._row(key)  # before the output: a record is in the output before it is checkpointed
        held = sink_counts(self.controls.records)
        checkpoint = str(row.checkpoint)
        upto = int(sequence) - 1
        if not before_only:
            upto = int(checkpoint.split("/")[0]) if checkpoint[:1].isdigit() else -1
        return sum(1 for record in stream_keys(self.base._kinesis(), self.state.stream_name, [row.shard])
                   if int(record[1].split()[0]) <= upto and record[1].split()[0] != sequence and not held[record])

    def _delivered(self, shard: str, sequence: str) -> bool:
        return sink_counts(self.controls.records)[(shard, f"{sequence} 0")] > 0

    def _logged(self, key: str, sequence: str) -> None:
        """The agents' log lines about the record (bisection, the judgement, the quarantine), with their times."""
        logs = Path(self.state.control_socket).parent / LOG_DIR
        lines = [f"  {path.stem}: {line[:220]}" for path in sorted(logs.glob("agent*.log"))
                 for line in path.read_text(errors="replace").splitlines()
                 if f"{key}: " in line and (sequence in line or LOGGED[0] in line)
                 and any(word in line for word in LOGGED)]
        for line in lines[:LOG_LINES]:
            self.say(line)
        if len(lines) > LOG_LINES:
            self.say(f"  ... {len(lines) - LOG_LINES} more such lines")
