"""The bridge against a child written from the protocol alone: answers, deadlines, restarts, skipped lines, stderr."""

from __future__ import annotations

import base64
import json
import logging
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shardherd.agent.consumer import Checkpointer
from shardherd.agent.multilang import messages
from shardherd.agent.multilang.bridge import ChildOptions, MultiLangProcessor
from shardherd.agent.multilang.child import ChildFailed
from shardherd.agent.records import Record
from shardherd.shared.checkpoint import Checkpoint

CHILD = Path(__file__).with_name("scripted_child.py")
RECORD = Record("shardId-1", "49500", 2, "pk", None, datetime(2026, 1, 1, tzinfo=UTC), b"\x00data", True, 3)
UNUSED = Checkpointer(None, "shardId-1")  # type: ignore[arg-type]  # these children never checkpoint in a batch


def bridge(tmp_path: Path, script: str, timeout: float | None = None) -> tuple[MultiLangProcessor, Path]:
    trace = tmp_path / "trace.jsonl"
    env = {"MULTILANG_SCRIPT": script, "MULTILANG_TRACE": str(trace), "PATH": "/usr/bin:/bin"}
    options = ChildOptions(command=(sys.executable, str(CHILD)), workdir=tmp_path, env=env, timeout=timeout,
                           exit_grace=5)
    return MultiLangProcessor(options), trace


def traced(trace: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in trace.read_text().splitlines()]


def test_messages_carry_every_field_and_noise_is_skipped_or_logged(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    processor, trace = bridge(tmp_path, "noise,checkpoint-in-init")
    processor.initialize("shardId-1", Checkpoint("49000", 1))
    processor.process_records([RECORD], UNUSED, 17)
    processor.lease_lost("shardId-1")
    initialize, answer, batch, lost = traced(trace)
    assert initialize == {"action": "initialize", "shardId": "shardId-1", "sequenceNumber": "49000",
                          "subSequenceNumber": 1}
    # no checkpointer while initializing: the daemon's answer, position echoed
    assert answer == {"action": "checkpoint", "sequenceNumber": None, "subSequenceNumber": None,
                      "error": "InvalidStateException"}
    assert batch == {"action": "processRecords", "millisBehindLatest": 17, "records": [
        {"action": "record", "data": "AGRhdGE=", "partitionKey": "pk", "sequenceNumber": "49500",
         "subSequenceNumber": 2, "approximateArrivalTimestamp": 1767225600000}]}
    assert lost == {"action": "leaseLost"}
    text = caplog.text
    assert "skipping a line of the record processor's stdout that is no message: hello" in text
    assert "shardId-1 stderr: a line on stderr" in text and "shardId-1 stderr: partial without newline" in text


def test_a_batch_line_is_json_whatever_its_keys_and_bytes_hold() -> None:
    awkward = [replace(RECORD, partition_key='p"k\\\n\u00e9\U0001f600\x7f', data=bytes(range(256)),
                       approximate_arrival_timestamp=None),
               replace(RECORD, sequence_number="4" * 56, sub_sequence_number=2**63 - 1, data=b"")]
    line = messages.process_records(awkward, None)
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and line.isascii()
    assert json.loads(line) == {"action": "processRecords", "millisBehindLatest": None, "records": [
        {"action": "record", "data": base64.b64encode(bytes(range(256))).decode(),
         "partitionKey": 'p"k\\\n\u00e9\U0001f600\x7f', "sequenceNumber": "49500", "subSequenceNumber": 2,
         "approximateArrivalTimestamp": None},
        {"action": "record", "data": "", "partitionKey": "pk", "sequenceNumber": "4" * 56,
         "subSequenceNumber": 2**63 - 1, "approximateArrivalTimestamp": 1767225600000}]}
    assert json.loads(messages.process_records([], 0)) == {"action": "processRecords", "records": [],
                                                          "millisBehindLatest": 0}


def test_a_hung_child_is_replaced_and_the_batch_delivered_again(tmp_path: Path) -> None:
    processor, trace = bridge(tmp_path, "hang-once", timeout=1)
    processor.initialize("shardId-1", Checkpoint("49000"))
    with pytest.raises(ChildFailed, match="no answer to processRecords within 1 s"):
        processor.process_records([RECORD], UNUSED, 0)
    processor.process_records([RECORD], UNUSED, 0)  # what the shard worker does next: the same batch
    processor.shutdown_requested("shardId-1", UNUSED)
    actions = [(m["action"], m.get("sequenceNumber")) for m in traced(trace)]
    assert actions == [("initialize", "49000"), ("processRecords", None), ("initialize", "49000"),
                       ("processRecords", None), ("shutdownRequested", None), ("leaseLost", None)]


def test_a_status_for_another_action_is_a_failed_child(tmp_path: Path) -> None:
    processor, _ = bridge(tmp_path, "wrong-status")
    processor.initialize("shardId-1", Checkpoint("TRIM_HORIZON"))
    with pytest.raises(ChildFailed, match="status for 'initialize' while waiting for processRecords"):
        processor.process_records([RECORD], UNUSED, 0)


def test_a_child_that_cannot_start_fails_the_attempt(tmp_path: Path) -> None:
    options = ChildOptions(command=("no-such-processor-executable",), workdir=tmp_path)
    with pytest.raises(ChildFailed, match="cannot start no-such-processor-executable"):
        MultiLangProcessor(options).initialize("shardId-1", Checkpoint("TRIM_HORIZON"))


def test_a_child_that_stops_reading_fails_the_write_within_the_deadline(tmp_path: Path) -> None:
    processor, _ = bridge(tmp_path, "stop-reading", timeout=1)
    processor.initialize("shardId-1", Checkpoint("TRIM_HORIZON"))
    big = Record("shardId-1", "49500", 0, "pk", None, None, b"x" * 2_000_000, False)  # more than a pipe holds
    with pytest.raises(ChildFailed, match="writing processRecords took more than 1 s"):
        processor.process_records([big], UNUSED, 0)


def test_a_child_that_answers_shard_ended_without_checkpointing_is_asked_again_by_a_new_one(tmp_path: Path) -> None:
    """The shard worker calls shard_ended again (with backoff) until SHARD_END is stored: each call is a fresh child,
    initialized at the last checkpoint, asked once (the Java daemon never asks again and only logs)."""
    processor, trace = bridge(tmp_path, "")
    processor.initialize("shardId-1", Checkpoint("49000"))
    processor.shard_ended("shardId-1", UNUSED)  # the scripted child answers without checkpointing
    processor.shard_ended("shardId-1", UNUSED)
    actions = [(m["action"], m.get("sequenceNumber")) for m in traced(trace)]
    assert actions == [("initialize", "49000"), ("shardEnded", None), ("initialize", "49000"), ("shardEnded", None)]


class Recording(Checkpointer):
    """A checkpointer that keeps what it is asked to store (the bridge's side of the protocol is under test)."""

    def __init__(self) -> None:
        super().__init__(None, "shardId-1")  # type: ignore[arg-type]  # never reaches a keeper
        self.stored: list[Checkpoint] = []

    def checkpoint(self, at: Record | Checkpoint | None = None) -> bool:
        assert isinstance(at, Checkpoint)
        self.stored.append(at)
        return True


def test_a_checkpoint_without_a_position_covers_only_the_piece_in_hand_of_a_bisected_batch(tmp_path: Path) -> None:
    """The shard worker bisects a failing batch (poison records): after the whole batch failed, a child's
    `checkpoint()` in a smaller piece must not reach past that piece's last record (the poison record is after it)."""
    processor, _ = bridge(tmp_path, "poison,checkpoint-batches")
    processor.initialize("shardId-1", Checkpoint("49000"))
    good = [replace(RECORD, sequence_number=str(49500 + index), sub_sequence_number=0, sub_record_count=1)
            for index in range(3)]
    poison = replace(good[-1], sequence_number="49600", data=b"poison")
    checkpointer = Recording()
    with pytest.raises(ChildFailed):
        processor.process_records([*good, poison], checkpointer, 0)
    processor.process_records(good[:2], checkpointer, 0)
    processor.process_records(good[2:], checkpointer, 0)
    with pytest.raises(ChildFailed):
        processor.process_records([poison], checkpointer, 0)
    processor.lease_lost("shardId-1")
    assert checkpointer.stored == [good[1].checkpoint, good[2].checkpoint]
