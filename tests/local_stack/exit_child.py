"""A stack child for the restart tests: records its start and exits with a code, or waits to be stopped.

    python -m shardherd.services.local_stack.child GRACE tests.local_stack.exit_child DIR CODE|wait

Appends its pid to `DIR/starts`, then exits with CODE (or sleeps until signalled, for `wait`).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path


def main() -> None:
    directory, code = Path(sys.argv[1]), sys.argv[2]
    with open(directory / "starts", "a", encoding="utf-8") as starts:
        starts.write(f"{os.getpid()}\n")
    if code == "wait":
        threading.Event().wait(600)
    sys.exit(int(code))


if __name__ == "__main__":
    main()
