"""The real amazon_kclpy package driving processors written against its v2 and v3 APIs under `shardherd multilang`."""

from __future__ import annotations

import pytest

from tests.multilang.stack import MultiLangStack, all_seen
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(120)]


def test_v3_processor_checkpoints_at_sequence_numbers_and_hands_off_on_stop(two_shards: MultiLangStack) -> None:
    stack = two_shards
    first = stack.produce(40, "a")
    properties = stack.properties()
    stack.start("ml-1", properties, MULTILANG_API="v3", MULTILANG_PROBE="1")
    wait_for(lambda: all_seen(stack, first), 40, "every record processed")
    expected = stack.last_sequences(first)
    wait_for(lambda: stack.checkpoints() == expected, 10, "checkpoints at each shard's last record")
    notes = stack.notes()
    assert sorted(n for n in notes if " initialize " in n) == sorted(
        f"{shard} initialize TRIM_HORIZON 0" for shard in expected)
    assert any(n.endswith("probe IllegalArgumentException") for n in notes), notes  # beyond the batch: refused
    assert stack.stop("ml-1") == 0
    notes = stack.notes()
    for shard in expected:  # the daemon's graceful shutdown: shutdownRequested, then leaseLost
        mine = [n.split(" ", 1)[1] for n in notes if n.startswith(shard) and "probe" not in n]
        assert mine[-2:] == ["shutdownRequested", "leaseLost"], mine

    # Another worker continues every shard right after those checkpoints: nothing read twice.
    second = stack.produce(20, "b")
    stack.start("ml-2", properties, MULTILANG_API="v3")
    wait_for(lambda: all_seen(stack, second), 40, "the new records processed by ml-2")
    assert max(stack.delivered().values()) == 1
    for shard, sequence in expected.items():
        assert f"{shard} initialize {sequence} 0" in stack.notes()
    assert "stderr" not in stack.log("ml-2") or "Traceback" not in stack.log("ml-2")


def test_v2_processor_bare_checkpoints_and_a_crash_redelivers_the_record(two_shards: MultiLangStack) -> None:
    stack = two_shards
    first = stack.produce(30, "a")
    stack.start("ml-1", stack.properties(), MULTILANG_API="v2", MULTILANG_CHECKPOINT="bare",
                MULTILANG_CRASH_ONCE="a-17")
    wait_for(lambda: all_seen(stack, first), 40, "every record processed, a-17 after the crash")
    expected = stack.last_sequences(first)
    wait_for(lambda: stack.checkpoints() == expected, 10, "checkpoint() without arguments at each shard's end")
    crashed = (stack.ledger.parent / "ledger.txt.crashed").read_text()
    initializes = [n for n in stack.notes() if n.startswith(crashed) and " initialize " in n]
    assert len(initializes) == 2, initializes  # the child was started again for the same shard
    log = stack.log("ml-1")
    assert "crashing at a-17" in log  # the child's stderr is in the worker's log
    assert "delivering the same" in log
    assert stack.stop("ml-1") == 0
    assert any(n.endswith("shutdownRequested") for n in stack.notes())
