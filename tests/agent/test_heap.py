"""agent/heap.py's release of malloc's free pages: memory freed between live objects goes back to the system."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# 80 MB from malloc (above pymalloc's 512 bytes) in 4 kB blocks, every 50th kept: the free blocks lie between live
# ones, so glibc cannot give them back by shrinking its heap's top.
SCRIPT = """
import gc, json, sys
from shardherd.agent.heap import freeze_long_lived, release_free_heap
def rss():
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS")).split()[1]) * 1024
blocks = [bytearray(4000) for _ in range(20000)]
kept = blocks[::50]
del blocks
before = rss()
released = release_free_heap() if sys.argv[1] == "release" else freeze_long_lived("in the test") > 0
print(json.dumps({"released": released, "freed": before - rss(), "kept": len(kept),
                  "ctypes_util": "ctypes.util" in sys.modules}))
"""


def _run(how: str) -> dict[str, int]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, how], capture_output=True, text=True, timeout=60, check=True)
    result: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc")
@pytest.mark.parametrize("how", ["release", "freeze"])
def test_free_pages_between_live_blocks_go_back_to_the_system(how: str) -> None:
    result = _run(how)
    assert result["released"] and result["kept"] == 400
    assert result["freed"] > 40 * 2**20  # of about 78 MB freed by Python, all but the kept blocks' pages
    assert not result["ctypes_util"]  # libc found without `ldconfig -p` in a child process
