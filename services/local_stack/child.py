"""Entry point of every stack child: runs a module as `__main__` and stops itself when the parent goes away.

The parent holds the write end of this process's stdin. When the parent exits for any reason (Ctrl-C, a crash, even
SIGKILL) the pipe closes, the watcher thread sees end-of-file and sends SIGTERM to this process, so agents drain and
coordinators release leadership exactly as on a normal stop; if that takes longer than the grace period the process
exits hard. Usage: `python -m shardherd.services.local_stack.child GRACE_SECONDS MODULE [ARGS...]`.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading


def watch_parent(stdin: int, grace: float) -> None:
    """Block until `stdin` reaches end of file, then SIGTERM this process; exit hard after `grace` more seconds."""
    while os.read(stdin, 4096):
        pass
    os.kill(os.getpid(), signal.SIGTERM)
    threading.Event().wait(grace)
    os._exit(3)


def main(argv: list[str]) -> None:
    """Start the watcher, then run `MODULE ARGS...` in this interpreter as if by `python -m`."""
    if len(argv) < 2:
        raise SystemExit("usage: python -m shardherd.services.local_stack.child GRACE_SECONDS MODULE [ARGS...]")
    grace, module, rest = float(argv[0]), argv[1], argv[2:]
    threading.Thread(target=watch_parent, args=(sys.stdin.fileno(), grace), name="parent-watch", daemon=True).start()
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
