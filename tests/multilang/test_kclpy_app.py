"""The real amazon_kclpy package driving processors written against its v3 and v2 APIs under `shardherd multilang`.

One application, three workers one after the other (each start costs seconds): a v3 processor checkpointing at
sequence numbers, stopped gracefully; then a v2 processor checkpointing without arguments, which crashes once on a
record, continuing from the first one's checkpoints; then one that crashes on a record every time, quarantined.
"""

from __future__ import annotations

import json

import pytest

from tests.multilang.stack import MultiLangStack, all_seen
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.dynamodb, pytest.mark.timeout(120)]


def test_v3_then_v2_processor_checkpoints_hand_off_and_a_crash_redelivers(two_shards: MultiLangStack) -> None:
    """About 28 s: three worker processes in turn on one stack (cheaper than three stacks); the poison phase is 13 s
    of them (three failures of the batch and three of the record, 1 + 2 s of backoff each, a child per attempt)."""
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
    assert stack.end("ml-1") == 0
    notes = stack.notes()
    for shard in expected:  # the daemon's graceful shutdown: shutdownRequested, then leaseLost
        mine = [n.split(" ", 1)[1] for n in notes if n.startswith(shard) and "probe" not in n]
        assert mine[-2:] == ["shutdownRequested", "leaseLost"], mine

    # A v2 processor continues every shard right after those checkpoints and crashes once on b-7.
    second = stack.produce(20, "b")
    stack.start("ml-2", properties, MULTILANG_API="v2", MULTILANG_CHECKPOINT="bare", MULTILANG_CRASH_ONCE="b-7")
    wait_for(lambda: all_seen(stack, second), 40, "the new records processed by ml-2, b-7 after the crash")
    for shard, sequence in expected.items():
        assert f"{shard} initialize {sequence} 0" in stack.notes()
    delivered = stack.delivered()
    assert all(delivered[data] == 1 for data in first)  # nothing before the checkpoints read again
    crashed = (stack.ledger.parent / "ledger.txt.crashed").read_text()
    assert len([n for n in stack.notes() if n.startswith(crashed) and " initialize " in n]) == 3  # restarted
    log = stack.log("ml-2")
    assert "crashing at b-7" in log  # the child's stderr is in the worker's log
    assert "delivering them again" in log  # the shard worker retries the batch (never skipped)
    expected = stack.last_sequences(first + second)
    wait_for(lambda: stack.checkpoints() == expected, 10, "checkpoint() without arguments at each shard's end")
    assert stack.end("ml-2") == 0
    assert [n for n in stack.notes() if n.endswith("shutdownRequested")][-2:]

    # A poison record (the child exits on c-5 every time) under poison_policy quarantine: the shard worker bisects
    # the batch, quarantines c-5 and goes on; checkpoint() without arguments never reaches past the piece in hand.
    dead = stack.workdir / "dead-letters"
    dead.mkdir()
    third = stack.produce(12, "c")
    stack.start("ml-3", properties, MULTILANG_API="v2", MULTILANG_CHECKPOINT="bare", MULTILANG_POISON="c-5",
                SHARDHERD_POISON_POLICY="quarantine", SHARDHERD_POISON_DESTINATION=dead.as_uri())
    rest = [data for data in third if data != "c-5"]
    wait_for(lambda: all_seen(stack, rest) and len(list(dead.glob("*/*/*.json"))) == 1, 60,
             "every other record processed, c-5 quarantined")
    delivered = stack.delivered()
    assert all(delivered[data] == 1 for data in rest) and delivered["c-5"] == 0
    [stored] = [json.loads(path.read_text()) for path in dead.glob("*/*/*.json")]
    assert (stored["shard_id"], stored["sequence_number"]) == stack.sequence["c-5"]
    expected = stack.last_sequences(first + second + third)
    wait_for(lambda: stack.checkpoints() == expected, 10, "checkpoints past the poison record at each shard's end")
    assert "poison record" in stack.log("ml-3") and stack.end("ml-3") == 0
