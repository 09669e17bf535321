"""Keep CPython's full garbage collections short in the agent's process: freeze the start-up heap.

A full (generation 2) collection walks every tracked object while holding the GIL, so every thread of the process,
the heartbeat's included, waits for it. A Spark driver holds PySpark, py4j, botocore's service models and the
agent (150,000+ objects): a full collection took 0.15 s of CPU during a micro-batch, 0.63 s of wall time at load 13
on 2 cores, and about 1.5 s at load 28, which is as long as a 3 s failover leaves between the 1.2 s heartbeat and
self-fencing (the stall behind drivers that fenced themselves soon after their query started). Objects that exist
once start-up is over live as long as the process; `gc.freeze()` moves them out of the collector's reach, so later
full collections walk only what was allocated since. Objects frozen are never collected, so the agent freezes only
at a few points (start, and after its first micro-batch, when PySpark's per-query imports are done).

Start-up also leaves malloc's heap with free pages between the objects it keeps (module loading, botocore's models,
the store's engine): glibc returns only the free top of its heap by itself, so after the start-up garbage is
collected `release_free_heap` asks it to return every free page (`malloc_trim`; 1.6-3 MiB of a plain agent built
offline).

A MultiLang agent runs some fifty threads (a reader, a read-ahead and three pipes per shard); glibc gives threads
that contend for malloc arenas of their own, up to eight per core, and each keeps memory it freed. Two arenas took
6 MB off the agent's resident memory with no change in its records/s (decision 0024): `limit_malloc_arenas`.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import time

log = logging.getLogger(__name__)

ARENA_ENV = "MALLOC_ARENA_MAX"  # glibc's own variable: when set, it decides and this module leaves it alone
_M_ARENA_MAX = -8  # mallopt's parameter number for the arena limit (glibc malloc.h)


def _libc() -> ctypes.CDLL:
    """The C library the interpreter is linked to, by the process's own symbols (dlopen(NULL)).

    Not `ctypes.util.find_library("c")`: on Linux that runs `ldconfig -p` in a child process, and its import brings
    subprocess and tempfile into every agent (about 1 MiB of its resident memory).
    """
    return ctypes.CDLL(None)


def freeze_long_lived(when: str) -> int:
    """Collect the garbage there is now, then freeze every surviving object; returns how many are frozen in all.

    Call it where the objects alive are those of start-up (imports, clients, sessions), not in a loop: every call
    leaves what is alive at that moment out of all later collections.
    """
    began = time.monotonic()
    gc.collect()
    gc.freeze()
    release_free_heap()
    frozen = gc.get_freeze_count()
    log.info("garbage collector: %d objects frozen %s (%.2f s): later full collections skip them", frozen, when,
             time.monotonic() - began)
    return frozen


def limit_malloc_arenas(count: int = 2) -> bool:
    """Cap glibc's malloc arenas at `count` (as MALLOC_ARENA_MAX would), unless that variable is set; True if done.

    Call it before the process starts its threads. Elsewhere than glibc (musl, macOS) it does nothing.
    """
    if ARENA_ENV in os.environ:
        return False
    try:
        libc = _libc()
        return bool(libc.mallopt(_M_ARENA_MAX, count))
    except (OSError, AttributeError):
        return False


def release_free_heap() -> bool:
    """Return the free pages of glibc's malloc heap to the system (`malloc_trim(0)`); True if glibc released some.

    Cheap (it walks the free lists once); elsewhere than glibc it does nothing.
    """
    try:
        libc = _libc()
        return bool(libc.malloc_trim(0))
    except (OSError, AttributeError):
        return False
