"""Where each batch's read of a shard stopped, recorded durably by the first read: the batch's end, fixed once.

Invariants:
- One coordinator-state item per hold of a lease (key `spark-end/<tenure>`, in the application's store), holding
  the end of the newest plan read under that hold: its query run and number, the last record read (with the
  sub-sequence of its last user record, so a checkpoint there covers it), what was read, and the
  NextShardIterator after it.
- An end is written only by the first read of its plan, conditionally (the item absent, or still holding the
  previous number), before that read hands out any row; every other read of the plan reads through it. So all
  reads of one plan give the same rows, whichever executor, attempt or action does them.
- A plan older than the recorded one of the same run yields no row (StaleBatch): Spark plans batch n+1 only after
  batch n committed. A run is a query's sequence of plans (a fresh Spark checkpoint starts a new one, numbered
  from 1 again; a query restarted on its checkpoint continues its run).
- The driver checkpoints a written batch at the recorded end (nothing recorded: no checkpoint) and deletes the
  item when the hold ends.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from shardherd.agent.reader import ShardReadError
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.store import LeaseStore

KEY_PREFIX = "spark-end/"


class StaleBatch(ShardReadError):
    """A read of a plan older than the one whose end is recorded for its hold (a leftover task): no row given."""


@dataclass(frozen=True, slots=True)
class BatchEnd:
    """Where the read of one plan stopped: `end` None if it read nothing (the checkpoint stays).

    MillisBehindLatest alone does not say the read reached the tip: records written in the same millisecond as the
    last one read are 0 ms behind it. A read is caught up when its last answer was also shorter than asked.
    """

    tenure: str
    run: str
    number: int
    end: Checkpoint | None
    records: int = 0
    bytes: int = 0
    iterator: str | None = None
    behind_millis: int | None = None
    first_arrival: float | None = None
    last_arrival: float | None = None
    caught_up: bool = False  # the read ended at the shard's tip: its last answer was short and 0 ms behind
    calls: int = 0  # GetRecords calls the read made (answered), for the shard's /metrics on the driver
    throttled: int = 0  # its GetRecords and GetShardIterator attempts Kinesis throttled (retried after a backoff)

    def to_item(self) -> dict[str, str | int]:
        """The coordinator-state attributes (the number apart, for the write's condition)."""
        value: dict[str, Any] = asdict(self)
        value["end"] = None if self.end is None else [self.end.sequence_number, self.end.sub_sequence_number]
        return {"run": self.run, "n": self.number, "v": json.dumps(value)}

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> BatchEnd:
        """Parse a stored item (ShardReadError if it is not one)."""
        try:
            value = json.loads(str(item["v"]))
            end = value.pop("end")
            return cls(**{**value, "end": None if end is None else Checkpoint(str(end[0]), int(end[1]))})
        except (KeyError, TypeError, ValueError) as exc:
            raise ShardReadError(f"malformed batch end {item!r}: {exc}") from exc


def end_key(tenure: str) -> str:
    """The coordinator-state key of a hold's batch end."""
    return KEY_PREFIX + tenure


def stored_end(store: LeaseStore, tenure: str) -> BatchEnd | None:
    """The end recorded under the hold `tenure`, whichever plan's (None if none)."""
    item = store.get_state(end_key(tenure))
    return None if item is None else BatchEnd.from_item(item)


def end_of_plan(recorded: BatchEnd | None, tenure: str, run: str, number: int) -> BatchEnd | None:
    """`recorded` if it is the end of that plan; None if it is another run's or an older plan's; StaleBatch if newer."""
    if recorded is None or recorded.run != run:
        return None
    if recorded.number > number:
        raise StaleBatch(f"plan {number} of hold {tenure} (run {run}) is older than the recorded {recorded.number}")
    return recorded if recorded.number == number else None


def recorded_end(store: LeaseStore, tenure: str, run: str, number: int) -> BatchEnd | None:
    """The end recorded for plan `number` of `run` under the hold `tenure`; None if none yet; StaleBatch if older."""
    return end_of_plan(stored_end(store, tenure), tenure, run, number)


def record_end(store: LeaseStore, end: BatchEnd) -> BatchEnd:
    """Record `end` unless another read of the same plan did first; the end every read of the plan must follow."""
    return record_over(store, end, stored_end(store, end.tenure))


def record_over(store: LeaseStore, end: BatchEnd, previous: BatchEnd | None) -> BatchEnd:
    """`record_end` given the hold's item as read before the plan's read (`stored_end`): one store read less.

    The write is conditional on that item being still there, so a read of the same plan that recorded its end in
    between wins, as with `record_end`.
    """
    same = end_of_plan(previous, end.tenure, end.run, end.number)
    if same is not None:
        return same
    condition: dict[str, str | int | bytes | None] = (
        {"key": None} if previous is None else {"run": previous.run, "n": previous.number})
    if store.put_state(end_key(end.tenure), end.to_item(), condition):
        return end
    winner = recorded_end(store, end.tenure, end.run, end.number)
    if winner is None:
        raise ShardReadError(f"the end of plan {end.number} of hold {end.tenure} could not be recorded")
    return winner


def forget_ends(store: LeaseStore, tenure: str) -> None:
    """Delete a hold's item (the hold ended: none of its plans is read again)."""
    store.delete_state(end_key(tenure))
