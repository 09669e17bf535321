"""bench/rolling_restart.py's per-shard measure: a shard's unread time at its agent's restart, apart from the rest."""

import os
import time
from pathlib import Path

from bench.rolling_restart import WORKER_PREFIX, Pass, Restart, Watch, per_shard, restart_overrun
from shardherd.services.local_stack.state import StackState


def _pass(gaps: dict[str, list[tuple[float, float]]], restarts: list[Restart]) -> Pass:
    figures = Pass("reservations", restarts=restarts)
    figures.gaps.update(gaps)
    return figures


def test_only_the_stretch_at_the_restart_counts_against_it() -> None:
    # shard a: 6 s unread across its agent's 5 s restart at t=100, and a 4 s stretch at t=300 (another agent's turn)
    # shard b: read through the restart of the agent that held it (0 unread at it), 5 s unread at t=200
    figures = _pass({"a": [(99.5, 105.5), (300.0, 304.0)], "b": [(200.0, 205.0)]},
                    [Restart(100.0, 5.0, ("a", "b"))])
    over, apart = restart_overrun(figures)
    assert [(item.shard, item.beyond, item.from_last) for item in over] == [("a", 0.5, 1.0), ("b", -5.0, -5.0)]
    assert sorted(apart) == [(200.0, 205.0), (300.0, 304.0)]
    text = per_shard(figures)
    assert "from SIGTERM median -2.2 s, max 0.5 s" in text and "SIGTERM: median -2.0 s, max 1.0 s" in text
    assert "2 stretches, 9.0 shard-seconds" in text


def test_a_stretch_that_began_before_sigterm_counts_from_sigterm_and_whole_apart() -> None:
    # The shard's reader read it until SIGTERM (once per idle wait): the 10 s before it are not the restart's
    over, _ = restart_overrun(_pass({"a": [(90.0, 106.0)]}, [Restart(100.0, 5.0, ("a",))]))
    assert [(item.beyond, item.from_last) for item in over] == [(1.0, 11.0)]


def test_a_batch_written_before_the_old_process_exited_is_not_the_new_one_reading(tmp_path: Path) -> None:
    """The sampler looks every 0.25 s; the old process's last batch, seen only after its exit, grew at its write."""
    state = StackState(os.getpid(), "app", "stream", "us-east-1", None, None, "", "", None)
    watch = Watch(state, tmp_path, gap=3.0)
    keys = tmp_path / "agent-1" / "shardId-000000000001.keys"
    keys.parent.mkdir()
    offset = time.time() - time.monotonic()
    keys.write_text("1 0\n", encoding="ascii")
    os.utime(keys, (time.time() - 5.0, time.time() - 5.0))
    watch.sample()
    keys.write_text("1 0\n2 0\n", encoding="ascii")  # the last batch before SIGTERM ...
    written = time.monotonic() - 1.0
    os.utime(keys, (written + offset, written + offset))  # ... written a second ago
    exited = time.monotonic() - 0.5  # the process exited after it, before this sample
    watch.sample()
    assert watch.reads_again("agent-1", exited) is None
    assert abs((watch.last_write("shardId-000000000001", exited) or 0.0) - written) < 0.01
    with keys.open("a", encoding="ascii") as out:
        out.write("3 0\n")  # the new process's first batch
    watch.sample()
    again = watch.reads_again("agent-1", exited)
    assert again is not None and again > exited
    assert watch.first_write(WORKER_PREFIX + "agent-1", exited) == again
