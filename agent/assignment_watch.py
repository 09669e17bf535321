"""The agent's side of the coordinator channel: long-poll the leader replica for changes to this worker's leases.

While the coordinator answers, the lease keeper applies each answer (coordinator/assignment_feed.py) and queries the
owner index only every `discovery_fallback_interval_millis`; when no replica answers (coordinator down, replicas
that do not lead), it is told so and queries every `discovery_interval_millis` as before. Processing never depends
on this channel: it only decides how soon the keeper looks, and the keeper reads every lease it starts from the
store.

The watch also carries the keeper's news to the leader (`news()`, decision 0010): a short request with `news=true`
from its own thread, so the leader scans the store at once rather than at its next full scan, and each new worker
row the keeper wrote (`beat()`: the same short request without `news`), so the leader knows the row at once and
publishes it to a successor within a lock heartbeat (coordinator/liveness.py); a long-poll names it only when it
returns, up to a heartbeat period later, and a leader killed in between left its successor to watch that row afresh.

Each answer also carries the leader's verdict on a fleet-wide stall (decision 0039) and the worker's leases whose
reads stalled at two workers or more (decision 0043), handed to `fleet_verdict`: the stall watch keeps stalled leases
only while such answers keep coming (agent/stall_watch.py).

It sends the read token (`api_read_token` / `api_read_token_file`; the admin token `api_token` only where no read
token is given), read again whenever its file changes, so a rotated Secret is picked up without a restart. Without a
valid token the coordinator answers but does not count the agent as listening or signalling (decision 0021); a
refused token (401, 403) is logged as an error, once per spell of refusals, never silently.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from shardherd.shared.api_token import TokenSource
from shardherd.shared.assignment_channel import FeedPosition
from shardherd.shared.clock import Clock
from shardherd.shared.config import Settings
from shardherd.shared.errors import ConfigError
from shardherd.shared.plain_http import HttpClient, HttpError, Response
from shardherd.shared.supervision import Supervisor

log = logging.getLogger(__name__)

WAIT_SECONDS = 20.0  # how long one request may wait at the coordinator
SLACK_SECONDS = 5.0  # network time on top of the wait before a request counts as failed
RETRY_SECONDS = (0.05, 0.05, 1.0, 2.0, 5.0)  # after failures in a row (a 409 may reach the leader on a retry)
NEWS_ATTEMPTS = 3  # a news request answered by a replica that does not lead is sent again on a new connection


class Told(Protocol):
    """What the watch tells (the lease keeper)."""

    def tell(self, leases: dict[str, str]) -> None:
        """The coordinator's view of this worker's leases changed."""

    def discover_soon(self) -> None:
        """The channel stopped answering: look in the store now."""

    def last_beat(self) -> tuple[int, int] | None:
        """The `hb` and `lut` of the worker row last written (sent with each request), if any."""


class AssignmentWatch:
    """Long-polls `coordinator_url` on a thread; `healthy()` says whether the keeper can rely on it now."""

    def __init__(self, settings: Settings, keeper: Told, clock: Clock,
                 fleet_verdict: Callable[[bool, frozenset[str]], None] | None = None) -> None:
        if not settings.coordinator_urls:
            raise ValueError("the assignment watch needs coordinator_url")
        path = f"/v1/workers/{settings.worker_id}/assignments/changes"
        self._urls = [f"{base.rstrip('/')}{path}" for base in settings.coordinator_urls]
        self._at = 0  # the replica asked now: the next one after a failure or a 409 (it may lead)
        self._token = _credential(settings)
        self._refused = False  # in a spell of refused tokens (logged once at its start)
        self._keeper = keeper
        self._fleet_verdict = fleet_verdict  # hears the leader's stall verdicts of each answer (decisions 0039, 0043)
        self._clock = clock
        self._client = HttpClient()
        self._healthy_until = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="assignment-watch", daemon=True)
        self._send = threading.Event()  # news or a beat to send
        self._news = False  # the next short request asks the leader to scan (news=true)
        self._notifier = threading.Thread(target=self._notify, name="assignment-news", daemon=True)

    def healthy(self) -> bool:
        """True while a request answered within the last wait plus slack."""
        return self._clock.monotonic() < self._healthy_until

    def start(self, supervisor: Supervisor | None = None) -> AssignmentWatch:
        """Start long-polling (and the thread that carries news); under `supervisor` both restart after a failure."""
        if supervisor is None:
            self._thread.start()
            self._notifier.start()
        else:
            self._thread = supervisor.thread(self._thread.name, self._run)
            self._notifier = supervisor.thread(self._notifier.name, self._notify)
        return self

    def news(self) -> None:
        """Tell the leader to look at the store now; returns at once (the request goes from another thread)."""
        self._news = True
        self._send.set()

    def beat(self) -> None:
        """Name the worker row just written to the leader now; returns at once (sent from another thread)."""
        self._send.set()

    def stop(self) -> None:
        """Stop now: the client is closed, so a waiting request ends at once (shared/plain_http.py).

        The news thread is woken too: it waited for news in 1 s slices, and an agent's stop (a restart's new process,
        a drained pod's exit) waited up to that second for it.
        """
        self._stop.set()
        self._send.set()
        self._client.close()
        self._thread.join(WAIT_SECONDS + SLACK_SECONDS)
        self._notifier.join(SLACK_SECONDS * NEWS_ATTEMPTS)

    def _run(self) -> None:
        feed: str | None = None
        version = 0
        failures = 0
        while not self._stop.is_set():
            answer = self._ask(feed, version)
            if answer is not None:
                failures = 0
                self._healthy_until = self._clock.monotonic() + WAIT_SECONDS + SLACK_SECONDS
                if self._fleet_verdict is not None:
                    self._fleet_verdict(answer.fleet_stalls, answer.shard_stalls)
                if (answer.feed, answer.version) != (feed, version):
                    self._keeper.tell(answer.leases)
                feed, version = answer.feed, answer.version
                continue
            if self.healthy():
                self._healthy_until = 0.0
                self._keeper.discover_soon()
            self._at = (self._at + 1) % len(self._urls)  # the next replica listed (or the same one, re-asked)
            if failures >= 1:  # a new connection, which a Service may route to another replica
                self._client.close()
                self._client = HttpClient()
            self._stop.wait(RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)])
            failures += 1

    def _notify(self) -> None:
        """Send each batch of news (or a beat) as one short request naming the last row written.

        News is sent on up to NEWS_ATTEMPTS connections until the leader answers; a beat once (the next long-poll
        names the row anyway).
        """
        while not self._stop.is_set():
            if not self._send.wait(1.0) or self._stop.is_set():
                continue
            self._send.clear()
            news, self._news = self._news, False
            params = self._beat_params({"wait": 0, "news": "true"} if news else {"wait": 0})
            for attempt in range(max(NEWS_ATTEMPTS, len(self._urls)) if news else 1):
                url = self._urls[(self._at + attempt) % len(self._urls)]  # the replica that answered last first
                with HttpClient(SLACK_SECONDS) as client:
                    try:
                        response = client.get(url, params=params, headers=self._headers())
                    except HttpError as exc:
                        log.debug("assignment watch: news not delivered: %s", exc)
                        break
                self._note_refusal(response)
                if response.status_code == 200:
                    break

    def _beat_params(self, params: dict[str, str | int | float]) -> dict[str, str | int | float]:
        """`params` plus the row this agent last wrote: the leader's sightings stay fresh without a scan."""
        beat = self._keeper.last_beat()
        if beat is not None:
            params["hb"], params["lut"] = beat
        return params

    def _headers(self) -> dict[str, str]:
        if self._token is None:
            return {}
        try:
            token = self._token.current()
        except ConfigError as exc:
            log.error("assignment watch: %s; asking without a token", exc)
            return {}
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _note_refusal(self, response: Response) -> None:
        """Log a refused token loudly at the start of a spell of refusals; note its end."""
        refused = response.status_code in (401, 403)
        if refused and not self._refused:
            setting = self._token.setting if self._token is not None else "api_read_token"
            log.error("assignment watch: the coordinator refused this agent's token (HTTP %d: %s); the agent reads "
                      "its leases from the store until %s(_file) holds a token the coordinator accepts (re-read at "
                      "every request)", response.status_code, response.text[:200], setting)
        elif not refused and self._refused:
            log.warning("assignment watch: the coordinator accepts this agent's token again")
        self._refused = refused

    def _ask(self, feed: str | None, version: int) -> FeedPosition | None:
        params: dict[str, str | int | float] = {"after": version, "wait": WAIT_SECONDS}
        if feed is not None:
            params["feed"] = feed
        try:
            response = self._client.get(self._urls[self._at], params=self._beat_params(params), headers=self._headers(),
                                        timeout=WAIT_SECONDS + SLACK_SECONDS)
        except HttpError as exc:  # also when stop() closed the client under a waiting request
            if not self._stop.is_set():
                log.debug("assignment watch: %s", exc)
            return None
        self._note_refusal(response)
        if response.status_code != 200:
            log.debug("assignment watch: HTTP %d from %s", response.status_code, self._urls[self._at])
            return None
        try:
            body = response.json()
            answer = FeedPosition(str(body["feed"]), int(body["version"]),
                                  {str(key): str(value) for key, value in dict(body["leases"]).items()},
                                  body.get("fleet_stalls") is True,  # absent (an older coordinator): no verdict
                                  frozenset(str(key) for key in body.get("shard_stalls") or ()))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("assignment watch: unreadable answer: %s", exc)
            return None
        return answer


def _credential(settings: Settings) -> TokenSource | None:
    """The token this agent sends: the read token, else (with a warning) the admin token, else none."""
    for setting in ("api_read_token", "api_token"):
        if getattr(settings, setting) is not None or getattr(settings, f"{setting}_file"):
            if setting == "api_token":
                log.warning("assignment watch: this agent sends the admin token (api_token); give agents the read "
                            "token instead (api_read_token_file), so none of them can drain workers")
            try:
                return TokenSource.of(settings, setting)
            except ConfigError as exc:  # a missing file may appear later (a Secret being mounted): keep asking
                log.error("assignment watch: %s", exc)
                return TokenSource(setting, None, Path(getattr(settings, f"{setting}_file")), check=False)
    return None
