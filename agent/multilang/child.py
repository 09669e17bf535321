"""One record processor executable run as a child process: messages in on stdin, out on stdout, stderr to the log.

Invariants: a child's stdout is read by one thread into a queue, and each message is written to its stdin by a
thread of its own (so a wait for an answer or for a write has a deadline, and a child that prints garbage, nothing,
or stops reading never blocks the shard thread beyond it); its stderr is forwarded to this process's
log by another thread, line by line (a partial line when the child writes one without a newline), so a child never
blocks on a full pipe; a child that exits, closes stdout or misses a deadline raises ChildFailed, and `close` always
leaves no process behind (stdin closed, then SIGKILL after the grace period).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from shardherd.agent.multilang import messages
from shardherd.shared.errors import ShardherdError

log = logging.getLogger("shardherd.multilang.child")

_EOF = object()
READ_SLICE_SECONDS = 5.0  # how often a wait without deadline logs that it is still waiting
STDERR_CHUNK = 65536


class ChildFailed(ShardherdError):
    """The child exited, closed its stdout, could not be written to, or did not answer within its deadline."""


def resolve_command(command: Sequence[str], workdir: Path) -> list[str]:
    """The command with its executable found as the daemon's users expect: on PATH, else relative to `workdir`."""
    first = command[0]
    if "/" not in first and shutil.which(first) is None and (workdir / first).exists():
        first = str(workdir / first)
    return [first, *command[1:]]


class ChildProcess:
    """A running record processor executable for one shard."""

    def __init__(self, command: Sequence[str], workdir: Path, shard_id: str,
                 env: Mapping[str, str] | None = None) -> None:
        self.shard_id = shard_id
        self._messages: queue.Queue[object] = queue.Queue()
        try:
            self.process = subprocess.Popen(
                resolve_command(command, workdir), cwd=workdir, env=dict(env) if env is not None else None,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            raise ChildFailed(f"{shard_id}: cannot start {' '.join(command)}: {exc}") from exc
        self._readers = [
            threading.Thread(target=self._read_stdout, name=f"child-out-{shard_id}", daemon=True),
            threading.Thread(target=self._forward_stderr, name=f"child-err-{shard_id}", daemon=True),
        ]
        for thread in self._readers:
            thread.start()

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.process.pid

    def send(self, line: bytes, timeout: float | None, action: str) -> None:
        """Write one message line within `timeout` seconds; ChildFailed if the child does not take it.

        A child that stops reading fills the pipe: the write happens in a thread, so the wait has the same deadline
        as an answer.
        """
        failure: list[BaseException] = []
        written = threading.Event()

        def write() -> None:
            stdin = self.process.stdin
            try:
                assert stdin is not None
                stdin.write(line)
                stdin.flush()
            except (OSError, ValueError) as exc:
                failure.append(exc)
            finally:
                written.set()

        threading.Thread(target=write, name=f"child-in-{self.shard_id}", daemon=True).start()
        self._wait(written, timeout, f"writing {action}")
        if failure:
            raise ChildFailed(f"{self.shard_id}: cannot write {action} to the record processor "
                              f"({self._exit_note()})") from failure[0]

    def _wait(self, event: threading.Event, timeout: float | None, what: str) -> None:
        """Wait for `event`, logging every READ_SLICE_SECONDS; ChildFailed once `timeout` seconds passed."""
        started = time.monotonic()
        while not event.wait(READ_SLICE_SECONDS if timeout is None else min(READ_SLICE_SECONDS, timeout)):
            waited = time.monotonic() - started
            if timeout is not None and waited >= timeout:
                raise ChildFailed(f"{self.shard_id}: {what} took more than {timeout:.0f} s (timeoutInSeconds)")
            log.warning("%s: still %s after %.0f s", self.shard_id, what, waited)

    def next_message(self, timeout: float | None, waiting_for: str) -> messages.ChildMessage:
        """The child's next message; ChildFailed once it ends its output or `timeout` seconds pass without one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        started = time.monotonic()
        while True:
            left = READ_SLICE_SECONDS if deadline is None else min(READ_SLICE_SECONDS, deadline - time.monotonic())
            try:
                item = self._messages.get(timeout=max(0.0, left))
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise ChildFailed(f"{self.shard_id}: no answer to {waiting_for} within {timeout:.0f} s "
                                      "(timeoutInSeconds)") from None
                log.warning("%s: still waiting for the record processor's answer to %s after %.0f s",
                            self.shard_id, waiting_for, time.monotonic() - started)
                continue
            if item is _EOF:
                raise ChildFailed(f"{self.shard_id}: the record processor ended its output while handling "
                                  f"{waiting_for} ({self._exit_note()})")
            assert isinstance(item, messages.Status | messages.CheckpointRequest)
            return item

    def close(self, grace: float) -> int | None:
        """End the child: close its stdin (it exits at end of input), SIGKILL it after `grace` seconds; its code."""
        with contextlib.suppress(OSError, ValueError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        try:
            code: int | None = self.process.wait(grace)
        except subprocess.TimeoutExpired:
            log.warning("%s: record processor %d did not exit within %.1f s of end of input; killing it",
                        self.shard_id, self.pid, grace)
            self.kill()
            code = self.process.returncode
        for thread in self._readers:
            thread.join(2)
        return code

    def kill(self) -> None:
        """SIGKILL the child and reap it."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)

    def _exit_note(self) -> str:
        code = self.process.poll()
        if code is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.process.wait(1)
        return "still running" if code is None else f"exit code {code}"

    def _read_stdout(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        try:
            for raw in stdout:
                line = raw.decode("utf-8", errors="replace")
                message = messages.parse(line)
                if message is not None:
                    self._messages.put(message)
                elif line.strip():
                    log.info("%s: skipping a line of the record processor's stdout that is no message: %s",
                             self.shard_id, line.rstrip()[:500])
        except (OSError, ValueError):
            pass  # closed under us by close(): the same as end of output
        finally:
            self._messages.put(_EOF)

    def _forward_stderr(self) -> None:
        stderr = self.process.stderr
        assert stderr is not None
        fd = stderr.fileno()
        while True:
            try:
                chunk = os.read(fd, STDERR_CHUNK)
            except OSError:
                return
            if not chunk:
                return
            for line in chunk.decode("utf-8", errors="replace").splitlines():
                if line.strip():
                    log.info("%s stderr: %s", self.shard_id, line)
