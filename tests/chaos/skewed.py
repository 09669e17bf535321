"""`python -m tests.chaos.skewed SECONDS ARGS...`: run `shardherd ARGS` on a host whose wall clock is off by SECONDS.

Only `time.time` is shifted (as a wrongly set host clock would be); monotonic time is untouched. It is patched before
shardherd is imported, so the agent's SystemClock, its worker record's lastUpdate and its ledger times all see the skew.
"""

from __future__ import annotations

import sys
import time


def skew_wall_clock(seconds: float) -> None:
    """Make `time.time()` in this process return the real time plus `seconds`."""
    real = time.time
    time.time = lambda: real() + seconds


def main(argv: list[str]) -> int:
    """Shift the wall clock, then run the shardherd command line with the remaining arguments."""
    skew_wall_clock(float(argv[0]))
    from shardherd.services.cli import main as shardherd

    return shardherd(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
