"""`shardherd status` in a pipe (80 columns) and `--wide` (120): one line per row, fields cut short, never wrapped."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from shardherd.services.status_cli import NARROW, WIDE, OperatorClient, show_status
from shardherd.shared.store import LeaseStore
from tests.services.harness import Replica
from tests.support.stores import make_store

LONG_WORKER = "ip-10-0-12-34.eu-west-1.compute.internal:4242"


def rendered(store: LeaseStore, width: int, wide: bool) -> list[str]:
    """What `status` prints for two workers (one with a long EC2-style id) and three leases."""
    replica = Replica(store, shards=3)
    for worker in (LONG_WORKER, "agent-3"):
        replica.join(worker)
    replica.step(3)
    client = OperatorClient("http://testserver", None)
    client._http = replica.client  # the API app itself, in process (FastAPI's test client is an httpx client)
    out = io.StringIO()
    show_status(client, Console(file=out, width=width, color_system=None), wide)
    return out.getvalue().splitlines()


@pytest.mark.parametrize(("width", "wide"), [(NARROW, False), (WIDE, True)])
def test_every_row_is_one_line_within_the_width(tmp_path: Path, width: int, wide: bool) -> None:
    store = make_store("sqlite", sqlite_path=str(tmp_path / "status.db"))
    try:
        lines = rendered(store, width, wide)
    finally:
        store.close()
    assert max(len(line) for line in lines) <= width, "\n".join(lines)
    shard_rows = [line for line in lines if line.startswith(("shardId-", "…"))]
    assert [row.split()[0][-3:] for row in shard_rows] == ["000", "001", "002"], "\n".join(lines)  # ids told apart
    worker_rows = [line for line in lines if line.startswith(("agent-3", "ip-10-0"))]
    assert len(worker_rows) == 2, "\n".join(lines)  # one line per row: nothing wrapped onto a second line
    for row in worker_rows + shard_rows:  # the figures are never cut, the last column included
        assert "…" not in row.split("   ")[-1], row
    assert all(row.split()[-1] == "TRIM_HORIZON" for row in shard_rows) or not wide


def test_a_long_checkpoint_shows_its_ends() -> None:
    from shardherd.services.status_cli import _abbreviated

    sequence = "49651234567890123456789012345678901234567890123456789012"
    assert _abbreviated(sequence) == "49651234…89012345…"[:8] + "…" + sequence[-8:]
    assert _abbreviated("SHARD_END") == "SHARD_END" and _abbreviated(None) == "-"
