"""The HTTP client one coordinator replica uses to ask the leader replica (services/api/peer.py).

Short timeouts: the lock keeper asks once per heartbeat period and must not fall behind; a leader that does not
answer quickly is treated as not answering, and the caller falls back to the store.
"""

from __future__ import annotations

import logging
import threading

from pydantic import ValidationError

from shardherd.coordinator.leader_lock import HolderReport
from shardherd.services.api.peer import HoldOut, SnapshotOut
from shardherd.services.api.snapshot import ApiSnapshot
from shardherd.shared.api_token import TokenSource
from shardherd.shared.errors import ConfigError
from shardherd.shared.lean_httpx import httpx

log = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 1.0
SNAPSHOT_TIMEOUT_SECONDS = 3.0


class PeerClient:
    """Asks another replica's API for its hold on the lock or its snapshot; None whenever it does not answer well."""

    def __init__(self, tokens: TokenSource) -> None:
        self._tokens = tokens
        # One client per caller: the lock keeper's quick probes never wait behind an API thread's snapshot.
        self._probes = httpx.Client(timeout=PROBE_TIMEOUT_SECONDS)
        self._snapshots = httpx.Client(timeout=SNAPSHOT_TIMEOUT_SECONDS)
        self._guard = threading.Lock()
        self._failing: set[str] = set()  # URLs whose last answer failed (logged once per failing spell)

    def hold(self, url: str) -> HolderReport | None:
        """The replica's answer to `GET /v1/lock`."""
        body = self._get(self._probes, url, "/v1/lock")
        if body is None:
            return None
        try:
            hold = HoldOut.model_validate_json(body)
        except ValidationError:
            return None
        return HolderReport(hold.replica_id, hold.leading, hold.version)

    def snapshot(self, url: str, leader_id: str | None, fresh: bool = False) -> ApiSnapshot | None:
        """The leader's snapshot from `GET /v1/snapshot`, if the replica at `url` is `leader_id` and leads.

        `fresh`: for a caller with a token, at most the leader's `api_cache_millis` old (this replica's token asks).
        """
        body = self._get(self._snapshots, url, "/v1/snapshot?fresh=true" if fresh else "/v1/snapshot")
        if body is None:
            return None
        try:
            answer = SnapshotOut.model_validate_json(body)
        except ValidationError as exc:
            log.warning("the snapshot of %s cannot be read: %s", url, exc.errors()[0]["msg"])
            return None
        return answer.snapshot() if answer.replica_id == leader_id else None

    def close(self) -> None:
        """Close the connections."""
        self._probes.close()
        self._snapshots.close()

    def _get(self, client: httpx.Client, url: str, path: str) -> bytes | None:
        try:
            token = self._tokens.current()
        except ConfigError:
            token = None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            response = client.get(url.rstrip("/") + path, headers=headers)
        except httpx.HTTPError as exc:
            self._note(url, f"{type(exc).__name__}: {exc}")
            return None
        if response.status_code != 200:
            self._note(url, f"HTTP {response.status_code}")
            return None
        with self._guard:
            recovered = url in self._failing
            self._failing.discard(url)
        if recovered:
            log.info("replica %s answers again", url)
        return response.content

    def _note(self, url: str, why: str) -> None:
        with self._guard:
            first = url not in self._failing
            self._failing.add(url)
        if first:
            log.info("replica %s does not answer as the leader (%s): using the store", url, why)
