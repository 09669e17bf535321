"""CPU figures a test drives, served where a real agent looks for them: a cgroup v2 tree or an ECS metadata endpoint.

Worker processes on one test host share its CPU, so the host's own figure says nothing about any one worker. Each
worker instead gets its own source: a cgroup v2 directory tree in a temp folder (pointed at with `cgroup_root` /
SHARDHERD_CGROUP_ROOT) or a real HTTP server on 127.0.0.1 answering the ECS task metadata v4 `/task` and `/stats`
(`ecs_metadata_uri` / SHARDHERD_ECS_METADATA_URI). A driver thread advances each source's CPU counters at the
percentage the test sets, so the agent's unchanged sampling code measures that figure.
"""

from __future__ import annotations

import json
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TICK_SECONDS = 0.05
# The CPU a worker's fixture reports when it follows the load: a base plus a share per shard it processes (as on a
# real host, where reading and processing a shard costs CPU), so the leader balances on figures that track the load.
BASE_PERCENT = 15.0
PERCENT_PER_LEASE = 20.0


class DrivenCpu(ABC):
    """One worker's CPU source; `percent` is the share of its limit it reports as used."""

    def __init__(self, percent: float) -> None:
        self.percent = percent
        self._used = 0.0  # CPU seconds used so far
        self._at = time.monotonic()
        self._guard = threading.Lock()

    def set_percent(self, percent: float) -> None:
        """Report `percent` of the limit from now on (counters advance at that rate)."""
        with self._guard:
            self._advance()
            self.percent = percent

    def _advance(self) -> float:
        """Move the usage counter to now; the caller holds the guard. Returns the CPU seconds used so far."""
        now = time.monotonic()
        self._used += (now - self._at) * self.limit_cpus * self.percent / 100.0
        self._at = now
        return self._used

    @property
    @abstractmethod
    def limit_cpus(self) -> float:
        """The CPUs the simulated container may use."""

    @abstractmethod
    def settings(self) -> dict[str, str]:
        """The SHARDHERD_* settings pointing an agent at this source."""

    def overrides(self) -> dict[str, str]:
        """The same settings as `load_settings` arguments, for agents in the test's own process."""
        return {name.removeprefix("SHARDHERD_").lower(): value for name, value in self.settings().items()}

    @abstractmethod
    def tick(self) -> None:
        """Publish the counters (called by the driver thread)."""

    @abstractmethod
    def close(self) -> None:
        """Release what the source holds."""


class CgroupTree(DrivenCpu):
    """A cgroup v2 directory (`cgroup.controllers`, `cpu.stat`, `cpu.max`) whose `usage_usec` grows at `percent`."""

    def __init__(self, root: Path, percent: float = 0.0, cpus: float = 1.0) -> None:
        super().__init__(percent)
        self.root = root
        self._cpus = cpus
        root.mkdir(parents=True, exist_ok=True)
        (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n", encoding="ascii")
        (root / "cpu.max").write_text(f"{int(cpus * 100_000)} 100000\n", encoding="ascii")
        self.tick()

    @property
    def limit_cpus(self) -> float:
        """The quota over the period written to `cpu.max`."""
        return self._cpus

    def settings(self) -> dict[str, str]:
        """SHARDHERD_CGROUP_ROOT names the tree."""
        return {"SHARDHERD_CGROUP_ROOT": str(self.root)}

    def tick(self) -> None:
        """Rewrite `cpu.stat` atomically (a rename), so a reader never sees half a file."""
        with self._guard:
            used = self._advance()
        staged = self.root / "cpu.stat.tmp"
        staged.write_text(f"usage_usec {int(used * 1e6)}\nuser_usec {int(used * 1e6)}\nsystem_usec 0\n",
                          encoding="ascii")
        staged.replace(self.root / "cpu.stat")

    def close(self) -> None:
        """Nothing to release: the tree stays in the test's temp folder for inspection."""


class JsonServer:
    """A real HTTP server on 127.0.0.1 answering each GET with `answer(path)` as JSON (404 for None)."""

    def __init__(self, answer: Callable[[str], Any]) -> None:
        self.requests: list[str] = []
        served = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                served.requests.append(self.path)
                document = answer(self.path)
                body = json.dumps(document).encode() if document is not None else b"{}"
                self.send_response(200 if document is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="json-server", daemon=True)
        self._thread.start()
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class EcsMetadata(DrivenCpu):
    """A real ECS task metadata v4 endpoint on 127.0.0.1 for one container, its stats computed at each request.

    Like Docker, `/stats` answers the counters now as `cpu_stats` and those of the previous request as
    `precpu_stats`; the system counter grows at wall time x online CPUs, the container's at `percent` of its limit.
    """

    DOCKER_ID = "c0ffee"
    ONLINE_CPUS = 4

    def __init__(self, percent: float = 0.0, task_cpus: float = 2.0) -> None:
        super().__init__(percent)
        self._task_cpus = task_cpus
        self._previous = self._counters()
        self._server = JsonServer(self.document)
        self.uri = f"{self._server.base}/v4/{self.DOCKER_ID}"

    @property
    def limit_cpus(self) -> float:
        """The task's vCPUs: this container is the task's only one."""
        return self._task_cpus

    def settings(self) -> dict[str, str]:
        """SHARDHERD_ECS_METADATA_URI names the endpoint."""
        return {"SHARDHERD_ECS_METADATA_URI": self.uri}

    def tick(self) -> None:
        """Nothing to publish: `/stats` computes the counters at each request."""

    def _counters(self) -> dict[str, Any]:
        with self._guard:
            used = self._advance()
        return {"cpu_usage": {"total_usage": int(used * 1e9)}, "online_cpus": self.ONLINE_CPUS,
                "system_cpu_usage": int(time.monotonic() * 1e9 * self.ONLINE_CPUS)}

    def document(self, path: str) -> dict[str, Any] | None:
        """The JSON answer for a request path, None for an unknown one."""
        base = f"/v4/{self.DOCKER_ID}"
        if path == f"{base}/task":
            return {"Cluster": "test", "Limits": {"CPU": self._task_cpus},
                    "Containers": [{"DockerId": self.DOCKER_ID, "Limits": {"CPU": 1024}}]}
        if path == f"{base}/stats":
            current = self._counters()
            previous, self._previous = self._previous, current
            return {"cpu_stats": current, "precpu_stats": previous}
        return None

    def close(self) -> None:
        """Stop the server."""
        self._server.close()


class CpuFleet:
    """Every worker's driven CPU source, alternating cgroup trees and ECS endpoints, and the thread driving them.

    With `holders` (called every `follow_period` seconds, it lists the worker processing each lease) every worker's
    CPU follows its load: BASE_PERCENT plus PERCENT_PER_LEASE per lease, at most 95. `set` pins a worker's figure.
    """

    def __init__(self, root: Path, holders: Callable[[], Iterable[str | None]] | None = None,
                 period: float = TICK_SECONDS, follow_period: float = 0.5) -> None:
        self.root = root
        self.sources: dict[str, DrivenCpu] = {}
        self._holders = holders
        self._pinned: set[str] = set()
        self._period = period
        self._follow_period = follow_period
        self._stop = threading.Event()
        self._guard = threading.Lock()
        self._thread = threading.Thread(target=self._drive, name="cpu-fleet", daemon=True)
        self._thread.start()

    def add(self, worker: str, percent: float = BASE_PERCENT, kind: str | None = None) -> DrivenCpu:
        """A new source for `worker` (`cgroup` or `ecs`; by default the two kinds alternate)."""
        with self._guard:
            kind = kind or ("cgroup" if len(self.sources) % 2 == 0 else "ecs")
            source: DrivenCpu
            if kind == "cgroup":
                source = CgroupTree(self.root / worker.replace(":", "_"), percent)
            elif kind == "ecs":
                source = EcsMetadata(percent)
            else:
                raise ValueError(f"unknown CPU source kind {kind!r}: cgroup or ecs")
            self.sources[worker] = source
        return source

    def set(self, worker: str, percent: float) -> None:
        """Drive `worker`'s CPU to `percent` from now on, whatever its load."""
        with self._guard:
            source = self.sources[worker]
            self._pinned.add(worker)
        source.set_percent(percent)

    def _follow(self) -> None:
        assert self._holders is not None
        try:
            counts = Counter(self._holders())
        except Exception:  # the holders come from the store; a hiccup keeps the previous figures
            return
        with self._guard:
            following = [(w, s) for w, s in self.sources.items() if w not in self._pinned]
        for worker, source in following:
            percent = min(95.0, BASE_PERCENT + PERCENT_PER_LEASE * counts[worker])
            if source.percent != percent:
                source.set_percent(percent)

    def _drive(self) -> None:
        next_follow = 0.0
        while not self._stop.wait(self._period):
            if self._holders is not None and time.monotonic() >= next_follow:
                next_follow = time.monotonic() + self._follow_period
                self._follow()
            with self._guard:
                sources = list(self.sources.values())
            for source in sources:
                source.tick()

    def close(self) -> None:
        """Stop the driver and every endpoint."""
        self._stop.set()
        self._thread.join(5)
        for source in self.sources.values():
            source.close()
