"""`python -m tests.chaos.inject ARGS...`: run `shardherd ARGS` with a fault-injection hook the harness can pull.

`python -m tests.chaos.inject -m MODULE ARGS...` runs that module instead (the Spark ledger driver).

The hook is a daemon thread that polls `<FAULT_INJECT_DIR>/<SHARDHERD_WORKER_ID>.inject`. When the file appears it
is read and removed, and each line is one command:

- `raise NAME`: raise InjectedFault once inside every thread whose name or class name is NAME, or whose name starts
  with NAME followed by "-" (`shard` hits every `shard-<id>` worker), at the next bytecode it runs, as a bug or a
  failed library call would. One raise, as a real fault gives: it lands wherever the thread is (inside an iteration,
  where the loop's own handler may catch it, or in its supervisor's code). An earlier version raised every 50 ms for a
  second, so a raise could land in the supervisor's own backoff wait and kill a thread for a reason no bug gives;
- `die NAME`: the same with InjectedDeath, a BaseException no `except Exception` catches (as a `sys.exit()` in a
  library would raise): the thread ends unless something catches everything;
- `jump SECONDS`: move this process's wall clock (`time.time`) by SECONDS from now on; monotonic time is untouched, as
  when NTP steps a host's clock.

What it did goes to `<file>.done` (one line per command: the command and the threads it hit), so the harness knows
the injection landed. `time.time` is wrapped before shardherd is imported, so every module sees the jump.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import sys
import threading
import time
from pathlib import Path

INJECT_ENV = "FAULT_INJECT_DIR"
POLL_SECONDS = 0.05


class InjectedFault(Exception):
    """The exception a `raise` command puts into a thread."""


class InjectedDeath(BaseException):
    """The exception a `die` command puts into a thread: past every `except Exception`."""


class WallClock:
    """`time.time` plus an offset that a `jump` command changes."""

    def __init__(self) -> None:
        self.offset = 0.0
        self._real = time.time

    def install(self) -> None:
        """Replace `time.time` in this process."""
        time.time = lambda: self._real() + self.offset


def targets(name: str) -> list[threading.Thread]:
    """Live threads named `name`, of class `name`, or named `name-...`."""
    return [t for t in threading.enumerate()
            if t.name == name or type(t).__name__ == name or t.name.startswith(name + "-")]


def raise_in(thread: threading.Thread, kind: type[BaseException] = InjectedFault) -> bool:
    """Schedule `kind` in `thread`; True if the interpreter found it."""
    ident = thread.ident
    if ident is None:
        return False
    hit = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(kind))
    return bool(hit == 1)


def apply(command: str, clock: WallClock) -> str:
    """Carry out one command line; returns what it did."""
    verb, _, argument = command.strip().partition(" ")
    if verb in ("raise", "die"):
        kind = InjectedFault if verb == "raise" else InjectedDeath
        hit = sorted(t.name for t in targets(argument) if raise_in(t, kind))
        time.sleep(POLL_SECONDS)  # let the raise land before looking who is alive
        still = sorted(t.name for t in targets(argument))
        return f"{verb} {argument}: {','.join(hit) or 'no thread'}; alive after: {','.join(still) or 'none'}"
    if verb == "jump":
        clock.offset += float(argument)
        return f"jump {argument}: offset {clock.offset:+.1f}"
    return f"unknown command {command.strip()!r}"


def watch(path: Path, clock: WallClock) -> None:
    """Poll `path` for commands forever."""
    while True:
        time.sleep(POLL_SECONDS)
        try:
            text = path.read_text(encoding="utf-8")
            path.unlink()
        except FileNotFoundError:
            continue
        done = [apply(line, clock) for line in text.splitlines() if line.strip()]
        with open(f"{path}.done", "a", encoding="utf-8") as out:
            out.write("".join(f"{line}\n" for line in done))
        print(f"inject: {'; '.join(done)}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    """Install the hook, then run the shardherd command line (or, after `-m MODULE`, that module as a script)."""
    clock = WallClock()
    clock.install()
    directory = os.environ.get(INJECT_ENV)
    if directory:
        control = Path(directory) / f"{os.environ.get('SHARDHERD_WORKER_ID', 'process')}.inject"
        threading.Thread(target=watch, args=(control, clock), name="fault-inject", daemon=True).start()
    if argv[:1] == ["-m"]:
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    from shardherd.services.cli import main as shardherd

    return shardherd(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
