"""Restart reservations: a worker about to restart keeps its leases for a window instead of giving them away.

Invariants (decision 0035):
* The reservation lives in the worker's row and nowhere else: `restartWithinMillis` (SQL `restart_within_ms`), the
  longest the worker may stay silent and still find its leases waiting. It is set by the worker as it stops for a
  restart (`shutdown_mode: restart`) or by an operator (`shardherd drain --restart WORKER --within 60s`), never by a
  heartbeat (upserts keep it, as they keep `drainRequested`), and cleared by the worker once it is back (its first
  heartbeat landed). Being in the store, it survives a leader change; KCL ignores the attribute and keeps it.
* The window counts on the leader's own clock from the last change it saw in the row (liveness.py's silence, which a
  new leader takes over from its predecessor's sightings): no wall clocks of two hosts are compared.
* While it holds, the worker's leases are neither expired nor moved (drain and balancing leave them: `pinned`) and
  nobody else is given them; the lease rows stay ordinary rows (owner, counter, checkpoint) that KCL workers read as
  usual. The worker checkpointed what it delivered and stopped reading before setting it (it gives no lease back), and
  the process with the same worker id resumes each lease from its checkpoint.
* Past the window the leases fail over exactly as a dead worker's do today.
* An operator's drain flag (`drainRequested`, e.g. the scale-in of an autoscaler draining the worker it removes)
  overrides a reservation: a worker asked to drain gives its leases on whatever its deployment's shutdown mode.
"""

from __future__ import annotations

import re

from shardherd.shared.errors import ShardherdError
from shardherd.shared.worker import WorkerRecord

MIN_WINDOW_MS = 1_000
MAX_WINDOW_MS = 3_600_000
_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "": 1_000}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|)")


class BadRestartWindow(ShardherdError, ValueError):
    """A restart window that is not a duration between MIN_WINDOW_MS and MAX_WINDOW_MS."""


def parse_window(text: str) -> int:
    """Milliseconds of a window written `60s`, `1500ms`, `2m` or `60` (seconds); BadRestartWindow otherwise."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise BadRestartWindow(f"restart window {text!r} is not a duration like 60s, 1500ms or 2m")
    return check_window(round(float(match.group(1)) * _UNITS_MS[match.group(2)]))


def check_window(millis: int) -> int:
    """`millis` if it is a usable window; BadRestartWindow otherwise."""
    if not MIN_WINDOW_MS <= millis <= MAX_WINDOW_MS:
        raise BadRestartWindow(f"a restart window is between {MIN_WINDOW_MS // 1000} s and "
                               f"{MAX_WINDOW_MS // 60_000} min, got {millis} ms")
    return millis


def stored_window(value: object, repairs: list[str]) -> int | None:
    """A decoded row's reservation: the value if it is an integer >= 0, else None with a repair noted.

    A row with an unusable value loses only its reservation (its leases then fail over as any dead worker's).
    """
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    repairs.append(f"restart window {value!r} is not an integer >= 0: dropped")
    return None


def reserved(record: WorkerRecord | None, silent_seconds: float | None) -> bool:
    """True while `record` carries a reservation and its row has been silent for less than the window.

    `silent_seconds` is how long the leader has seen the row unchanged (None: it has not watched it yet, which counts
    as just seen). A worker without a row has no reservation; one an operator asked to drain keeps none.
    """
    if record is None or record.restart_within_ms is None or record.drain_requested:
        return False
    return (silent_seconds or 0.0) * 1000 < record.restart_within_ms


def stop_window(row: WorkerRecord | None, deployment: int | None) -> int | None:
    """The reservation a stopping worker makes (None: it drains), from its own row and its deployment's window.

    An operator's drain flag wins (an autoscaler removing the worker for good drained it first); then the
    deployment's window (`shutdown_mode: restart`); then a reservation an operator put in the row.
    """
    if row is not None and row.drain_requested:
        return None
    if deployment is not None:
        return deployment
    return row.restart_within_ms if row is not None else None
