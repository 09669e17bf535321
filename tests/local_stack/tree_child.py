"""A stack child for the supervisor tests: starts one sleeper in its process group and one in a group of its own.

    python -m shardherd.services.local_stack.child GRACE tests.local_stack.tree_child DIR

Writes `DIR/pids.json` ([same-group sleeper, own-group sleeper]) once both run. A sleeper that gets SIGTERM writes
`DIR/term-<pid>` and exits; this process exits on SIGTERM and leaves both sleepers behind for the supervisor.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

SLEEPER = """
import pathlib, signal, sys, time
def on_term(signum, frame):
    pathlib.Path(sys.argv[1], f"term-{__import__('os').getpid()}").touch()
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
pathlib.Path(sys.argv[1], f"ready-{__import__('os').getpid()}").touch()
time.sleep(600)
"""


def main() -> None:
    directory = Path(sys.argv[1])
    same = subprocess.Popen([sys.executable, "-c", SLEEPER, str(directory)])
    own = subprocess.Popen([sys.executable, "-c", SLEEPER, str(directory)], start_new_session=True)
    ready = [directory / f"ready-{same.pid}", directory / f"ready-{own.pid}"]
    while not all(path.exists() for path in ready):
        threading.Event().wait(0.05)
    temporary = directory / "pids.json.tmp"
    temporary.write_text(json.dumps([same.pid, own.pid]), encoding="utf-8")
    temporary.replace(directory / "pids.json")
    threading.Event().wait()  # until SIGTERM (default action: exit) or SIGKILL


if __name__ == "__main__":
    main()
