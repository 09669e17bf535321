"""agent/heap.py's arena cap: a MultiLang agent's threads share the malloc arenas it allows (glibc's own count)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Threads allocating at once (objects above pymalloc's 512 bytes come from malloc), then glibc's per-arena report.
SCRIPT = """
import ctypes, ctypes.util, sys, threading
from shardherd.agent.heap import limit_malloc_arenas
print(limit_malloc_arenas(int(sys.argv[1])) if sys.argv[1] != "0" else "unset", flush=True)
def churn():
    for _ in range(2000):
        kept = [bytearray(4000) for _ in range(50)]
threads = [threading.Thread(target=churn) for _ in range(8)]
for thread in threads: thread.start()
for thread in threads: thread.join()
ctypes.CDLL(ctypes.util.find_library("c")).malloc_stats()
"""


def arenas(limit: int, **env: str) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(limit)], capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}, **env}, check=True)
    return done.stdout.strip(), done.stderr.count("Arena ")


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's arenas")
def test_the_cap_holds_every_thread_to_its_arenas_unless_glibcs_variable_decides() -> None:
    assert arenas(1) == ("True", 1)  # without the cap, this machine's glibc made 6
    said, count = arenas(1, MALLOC_ARENA_MAX="3")
    assert said == "False" and count <= 3
