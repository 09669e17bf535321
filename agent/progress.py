"""Per-lease progress the agent reports with its heartbeat: lag behind the stream tip, records and bytes handled."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from shared.worker import LeaseProgress


class ProgressBoard:
    """Thread-safe totals per lease since this worker started holding it; shard threads write, the keeper reads."""

    def __init__(self) -> None:
        self._progress: dict[str, LeaseProgress] = {}
        self._guard = threading.Lock()

    def record(self, lease_key: str, records: int, byte_count: int, millis_behind_latest: int | None) -> None:
        """Add one delivered batch (an empty batch still updates the lag)."""
        with self._guard:
            before = self._progress.get(lease_key, LeaseProgress())
            lag = millis_behind_latest if millis_behind_latest is not None else before.millis_behind_latest
            self._progress[lease_key] = LeaseProgress(lag, before.records + records, before.bytes + byte_count)

    def drop(self, lease_key: str) -> None:
        """Forget a lease this worker no longer holds."""
        with self._guard:
            self._progress.pop(lease_key, None)

    def snapshot(self, lease_keys: Iterable[str]) -> dict[str, LeaseProgress]:
        """The progress of the given leases (those with any report)."""
        with self._guard:
            return {key: self._progress[key] for key in lease_keys if key in self._progress}
