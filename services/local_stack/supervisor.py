"""Child processes of the stack: each in its own process group, logging to a file, ending itself if we die.

Every child runs through `child.py` of this folder, which watches its stdin pipe: if this process disappears
(even by SIGKILL) the pipe closes and the child stops itself gracefully, so no orphans outlive the stack.
A graceful signal (SIGTERM) goes to the child alone, so it stops its own children in order (a Spark driver keeps its
JVM until its leases are handed on); SIGKILL goes to its whole process group, and whatever the child started that is
still there after it exited is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from shardherd.shared.clock import Clock, SystemClock
from shardherd.shared.errors import ShardherdError

REPO_ROOT = Path(__file__).resolve().parents[2]


class UnknownProcess(ShardherdError, KeyError):
    """No running child of the stack has that name."""


@dataclass(frozen=True)
class Launch:
    """How a child was started (`python -m module args...` with `env`), so it can be started again alike."""

    module: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    grace: float


@dataclass
class Child:
    """One supervised process."""

    name: str
    role: str
    process: subprocess.Popen[bytes]
    log_path: Path
    launch: Launch
    started: float  # the supervisor's clock's monotonic() at its start
    port: int | None = None
    api_url: str | None = None
    expected_exit: bool = False  # the supervisor or a scenario ended it on purpose
    reported: bool = False

    @property
    def pid(self) -> int:
        """The process id (also its process group id)."""
        return self.process.pid

    @property
    def alive(self) -> bool:
        """True until the process has exited."""
        return self.process.poll() is None


class Supervisor:
    """Starts children, signals them by name, and stops groups of them with a deadline and a SIGKILL fallback."""

    def __init__(self, log_dir: Path, clock: Clock | None = None) -> None:
        self.log_dir = log_dir
        self.clock = clock or SystemClock()  # what `Child.started` is measured with
        self._children: list[Child] = []
        self._guard = threading.RLock()

    def spawn(self, name: str, role: str, module: str, args: Sequence[str], env: Mapping[str, str],
              grace: float, port: int | None = None, api_url: str | None = None) -> Child:
        """Start `python -m module args...` under the parent-death watcher; it stops itself `grace` s after we die."""
        return self._start(name, role, Launch(module, tuple(args), dict(env), grace), port, api_url)

    def respawn(self, child: Child) -> Child:
        """Start an exited child again with the same name, command, environment, port and log (appended to)."""
        if child.alive:
            raise ValueError(f"{child.name} is still running")
        return self._start(child.name, child.role, child.launch, child.port, child.api_url)

    def _start(self, name: str, role: str, launch: Launch, port: int | None, api_url: str | None) -> Child:
        log_path = self.log_dir / f"{name}.log"
        env = launch.env
        python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        with self._guard, open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "shardherd.services.local_stack.child", str(launch.grace), launch.module,
                 *launch.args],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                env={**env, "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
            )
            child = Child(name, role, process, log_path, launch, self.clock.monotonic(), port, api_url)
            self._children.append(child)
        return child

    def children(self, role: str | None = None, alive_only: bool = True) -> list[Child]:
        """Children with `role` (all roles when None), alive ones only unless told otherwise, in start order."""
        with self._guard:
            return [child for child in self._children
                    if (role is None or child.role == role) and (child.alive or not alive_only)]

    def get(self, name: str) -> Child:
        """The running child called `name`."""
        for child in self.children():
            if child.name == name:
                return child
        raise UnknownProcess(f"no running process called {name!r} (running: "
                             f"{', '.join(child.name for child in self.children()) or 'none'})")

    def kill(self, name: str, sig: signal.Signals) -> Child:
        """Send `sig` on purpose (its exit is not reported as a crash): SIGKILL to the group, others to the child.

        SIGKILL also kills what the child started in groups of their own (PySpark's worker daemon makes one).
        """
        child = self.get(name)
        child.expected_exit = True
        if sig is signal.SIGKILL:
            started = _descendants(child)
            _signal_group(child, sig)
            _kill_all(started)
        elif child.alive:
            child.process.send_signal(sig)
        return child

    def unexpected_exits(self) -> list[Child]:
        """Children that exited without being asked to, each reported once."""
        with self._guard:
            found = [child for child in self._children
                     if not child.alive and not child.expected_exit and not child.reported]
            for child in found:
                child.reported = True
        return found

    def ended_on_purpose(self) -> list[Child]:
        """Children that exited after a scenario or the stack asked them to (not started again), each reported once."""
        with self._guard:
            found = [child for child in self._children
                     if not child.alive and child.expected_exit and not child.reported]
            for child in found:
                child.reported = True
        return found

    def ask_to_stop(self, children: Sequence[Child], sig: signal.Signals) -> None:
        """Ask children to stop (their exits are expected): send `sig` and close their stdin."""
        for child in children:
            child.expected_exit = True
            if child.alive:
                child.process.send_signal(sig)
            if child.process.stdin is not None and not child.process.stdin.closed:
                child.process.stdin.close()

    def stop(self, children: Sequence[Child], grace: float, sig: signal.Signals = signal.SIGTERM) -> None:
        """Send `sig` to every child and close its stdin; SIGKILL the group of any still there after `grace` s.

        Processes a child started (seen before the SIGTERM) that outlive it are killed once it has exited.
        """
        started = {child.pid: _descendants(child) for child in children}
        self.ask_to_stop(children, sig)
        deadline = time.monotonic() + grace
        for child in children:
            try:
                child.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(child, signal.SIGKILL)
                child.process.wait()
            _kill_all(started[child.pid])


def _descendants(child: Child) -> list[psutil.Process]:
    """The processes `child` started (the Spark JVM and its Python workers, say), while it runs."""
    if not child.alive:
        return []
    try:
        return psutil.Process(child.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _kill_all(processes: list[psutil.Process]) -> None:
    """SIGKILL each process still there (psutil checks it is still the one seen: no reused ids), then reap them."""
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            process.kill()
    psutil.wait_procs(processes, timeout=5)


def _signal_group(child: Child, sig: signal.Signals) -> None:
    if not child.alive:
        return  # reaped: its id may belong to someone else by now
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, sig)


def log_tail(path: Path, limit: int = 1500) -> str:
    """The end of a child's log file, for error messages."""
    try:
        with open(path, "rb") as log:
            log.seek(max(0, path.stat().st_size - limit))
            return log.read().decode("utf-8", "replace")
    except OSError:
        return ""

