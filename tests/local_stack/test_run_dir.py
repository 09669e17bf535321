"""The run directory's lock and per-run rotation, and the per-shard tally that survives moves (no stack needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shardherd.services.local_stack.state import LOCK_FILE, RunDirInUse, RunDirLock, rotate
from shardherd.services.local_stack.status import ShardTally

HOLDER = """
import sys, time
from pathlib import Path
from shardherd.services.local_stack.state import RunDirLock
RunDirLock(Path(sys.argv[1])).acquire()
print("locked", flush=True)
time.sleep(60)
"""


def test_a_live_owner_is_named_and_a_dead_owners_lock_is_taken_over(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirInUse, match=f"in use by another `shardherd up` \\(pid {holder.pid}\\)"):
            RunDirLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    assert (tmp_path / LOCK_FILE).read_text().strip() == str(holder.pid)  # a stale lock file of a dead process
    lock = RunDirLock(tmp_path).acquire()
    assert (tmp_path / LOCK_FILE).read_text().strip() == str(os.getpid())
    lock.release()
    RunDirLock(tmp_path).acquire().release()  # released means free again


def test_rotate_keeps_exactly_the_previous_run(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    for run in ("first", "second", "third"):
        rotate(logs)
        assert list(logs.iterdir()) == []
        (logs / "agent-1.log").write_text(run)
    rotate(logs)
    assert (tmp_path / "logs.previous" / "agent-1.log").read_text() == "third"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["logs", "logs.previous"]


def _lease(key: str, owner: str | None, records: int | None, next_owner: str | None = None) -> dict[str, object]:
    if next_owner is None:
        return {"lease_key": key, "owner": owner, "checkpoint_owner": None, "records_processed": records}
    return {"lease_key": key, "owner": next_owner, "checkpoint_owner": owner, "records_processed": records}


def test_tally_does_not_drop_when_a_shard_moves() -> None:
    tally = ShardTally()
    tally.update([_lease("s0", "a", 100), _lease("s1", "b", 10)])
    tally.update([_lease("s0", "a", 150, next_owner="b"), _lease("s1", "b", None)])  # handoff; s1 not reported
    assert tally.totals() == {"s0": 150, "s1": 10}
    tally.update([_lease("s0", "b", 5), _lease("s1", "b", 30)])  # b took s0: its count starts again
    assert tally.totals() == {"s0": 155, "s1": 30}
    tally.update([_lease("s0", "a", 7)])  # back on a, whose count restarts below its last report
    assert tally.totals() == {"s0": 162, "s1": 30}
    tally.update([_lease("s0", "b", 2)])  # and on b again
    assert tally.totals() == {"s0": 164, "s1": 30}  # 150 (a) + 5 (b) banked, + 7 (a) + 2 (b) now


def test_the_dashboard_address_carries_the_stacks_read_token(tmp_path: Path) -> None:
    """The printed dashboard address sends the read token, so the page's figures are fresh (issue 33)."""
    from shardherd.services.local_stack.state import READ_TOKEN_FILE
    from shardherd.services.up_cli import dashboard_fragment

    assert dashboard_fragment(tmp_path) == ""  # a stack without its own read token: the page reads anonymously
    (tmp_path / READ_TOKEN_FILE).write_text("read-token-abc\n", encoding="utf-8")
    assert dashboard_fragment(tmp_path) == "#token=read-token-abc"
