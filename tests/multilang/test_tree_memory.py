"""bench/multilang.py's memory of a process tree: a page that several processes of the tree map counts once."""

from __future__ import annotations

import subprocess
import sys

import psutil

from bench.multilang import tree_memory, tree_rss

# A parent with three children, all the same interpreter, each holding 20 MB of its own; "ready" once all are up.
PARENT = """
import subprocess, sys
child = "import sys; held = bytearray(20 << 20); print('up', flush=True); sys.stdin.read()"
children = [subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            for _ in range(3)]
for process in children:
    process.stdout.readline()
held = bytearray(20 << 20)
print("ready", flush=True)
sys.stdin.read()
"""


def test_shared_pages_count_once_and_private_pages_each_time() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == b"ready\n"
        processes = [psutil.Process(parent.pid), *psutil.Process(parent.pid).children()]
        assert len(processes) == 4
        largest = max(process.memory_info().rss for process in processes)
        private = sum(process.memory_full_info().uss for process in processes)
        summed, once = tree_rss(parent.pid), tree_memory(parent.pid)
        assert private >= 4 * (20 << 20)  # each process's own bytearray, once per process
        assert max(private, largest) <= once < summed  # the interpreter's shared library, once instead of 4 times
        assert summed - once >= 3 * (1 << 20)  # at least a MB of it per extra process
    finally:  # end of its input ends the parent, and so its children's input
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(10)
