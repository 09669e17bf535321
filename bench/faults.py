"""The fault matrix on real processes: each fault of tests/chaos/matrix.py injected into a fresh loopback fleet.

    python -m bench.faults [--spark] [--defaults] [--only SUBSTRING ...] [--keep DIR] [--out FILE]
    python -m bench.faults --remeasure DIR [--out FILE]   # the table again from a kept run's cells

Starts its own moto server and kinesalite on 127.0.0.1 and runs the cells one at a time (each about 45 s: fleet
start, the fault's hold, failover + 8 s of watching, the drain). Timings are the CI's short ones (failover 3 s,
leader interval 0.3 s), or with `--defaults` shardherd's defaults (failover 10 s, leader interval 2 s). Prints one
Markdown row per cell as it finishes and the whole table at the end (also to `--out`). The columns are explained in
tests/chaos/matrix.py and docs/failure-model.md.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from shardherd.services.emulators.kinesalite import Kinesalite
from shardherd.services.emulators.moto_server import MotoServer
from tests.chaos.matrix import HEADER, OBSERVED, Cell, Observed, cells, measure, row, run_cell, spark_cells


def main(argv: list[str]) -> int:
    """Run the selected cells and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", default=[], help="run cells whose name contains this")
    parser.add_argument("--keep", type=Path, help="keep every cell's logs and ledgers under this directory")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    parser.add_argument("--spark", action="store_true", help="the Spark-driver cells instead of the plain ones")
    parser.add_argument("--defaults", action="store_true", help="default timings (failover 10 s) instead of short ones")
    parser.add_argument("--remeasure", type=Path, help="the table again from the cells kept in this directory")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))  # unwind: every child process is ended
    catalogue = spark_cells() if args.spark else cells()
    rows = remeasure(args.remeasure) if args.remeasure else run_cells(catalogue, args.only, args.keep, args.defaults)
    table = "\n".join([HEADER, *rows])
    print(table)
    if args.out:
        args.out.write_text(table + "\n", encoding="utf-8")
    return 0


def remeasure(kept: Path) -> list[str]:
    """One row per cell directory under `kept` that holds the cell's observations."""
    return [row(measure(Observed.load(path))) for path in sorted(kept.glob(f"cell-*/{OBSERVED}"))]


SHARDS_PER_RUN = 1000  # room for every cell's stream (4-6 shards each, splits included)


def run_cells(catalogue: list[Cell], only: list[str], keep: Path | None, defaults: bool = False) -> list[str]:
    """Run the cells whose name contains one of `only` (all when empty), one at a time; one row each."""
    chosen = [c for c in catalogue if not only or any(part in c.name for part in only)]
    rows: list[str] = []
    # Every cell creates its own stream in the one kinesalite: its default limit (100 shards) ended a full run at cell
    # 26 with "harness error: LimitExceededException" in every later cell.
    with tempfile.TemporaryDirectory(prefix="faults-") as scratch, MotoServer() as moto, \
            Kinesalite(shard_limit=SHARDS_PER_RUN) as kinesis:
        base = keep or Path(scratch)
        for index, cell in enumerate(chosen):
            started = time.monotonic()
            print(f"{time.strftime('%H:%M:%S')} cell {index + 1}/{len(chosen)}: {cell.name}", flush=True)
            try:
                result = run_cell(cell, moto.endpoint_url, kinesis.endpoint_url, base / f"cell-{index:02d}",
                                  defaults=defaults)
                rows.append(row(result))
            except Exception as exc:  # one broken cell must not lose the others' figures
                traceback.print_exc()
                rows.append(f"| {cell.name} | harness error: {str(exc)[:120]} |")
            print(f"  {rows[-1]}  ({time.monotonic() - started:.0f} s)", flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
