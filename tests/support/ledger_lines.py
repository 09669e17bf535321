"""The ledger file's line format, standard library only (processors in child processes import it without shardherd).

One line per delivered record: `shard sequence sub worker time data`, appended flushed and fsynced.
"""

from __future__ import annotations

import os
import time

LEDGER_ENV = "SHARDHERD_TEST_LEDGER"


def append_to_ledger(path: str, worker: str, records: list[tuple[str, str, int, bytes]]) -> None:
    """Append (shard, sequence, sub-sequence, data) records as ledger lines, flushed and fsynced before returning."""
    now = f"{time.time():.3f}"
    lines = "".join(f"{shard} {sequence} {sub} {worker} {now} {data.decode()}\n"
                    for shard, sequence, sub, data in records)
    with open(path, "a", encoding="utf-8") as ledger:
        ledger.write(lines)
        ledger.flush()
        os.fsync(ledger.fileno())


def read_ledger(path: str) -> list[tuple[str, str, int, str, float, str]]:
    """The ledger's entries (shard, sequence, sub-sequence, worker, time, data); a torn last line is ignored."""
    entries = []
    try:
        with open(path, encoding="utf-8") as ledger:
            for line in ledger:
                parts = line.rstrip("\n").split(" ", 5)
                if len(parts) == 6 and line.endswith("\n"):
                    entries.append((parts[0], parts[1], int(parts[2]), parts[3], float(parts[4]), parts[5]))
    except FileNotFoundError:
        return []
    return entries
