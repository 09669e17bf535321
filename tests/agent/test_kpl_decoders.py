"""The protobuf-runtime and pure-Python KPL decoders give the same answer: records, or BrokenAggregate, per input.

Differential tests over seeded generated aggregates (edge cases included), corrupted ones (re-framed with a valid
digest, so the protobuf parsers themselves meet the damage), random protobuf field soups and hand-built cases of
protobuf's parsing rules; then which decoder a process picks, and how to force the pure-Python one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import string
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import get_args

import pytest

from shardherd.agent import kpl_decoding, kpl_protobuf, kpl_python
from shardherd.agent.kpl import (
    DIGEST_SIZE,
    KPL_DECODERS,
    MAGIC,
    MAX_KINESIS_RECORD_BYTES,
    BrokenAggregate,
    UserRecord,
    encode_aggregate,
    encode_varint,
)
from shardherd.agent.read_spec import StartPosition
from shardherd.agent.runtime import Agent
from shardherd.agent.spark.offsets import ShardPlan
from shardherd.agent.spark.source import ShardPartition, SourceOptions, read_partition
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.config import Settings, load_settings
from shardherd.shared.errors import ConfigError
from shardherd.shared.memory_store import MemoryLeaseStore

Decoder = Callable[[bytes], list[UserRecord]]
Outcome = list[UserRecord] | type[BrokenAggregate]
KEY_ALPHABET = "ab-_.:/ é中🙂\u0000\uffff𝄞"


def framed(body: bytes) -> bytes:
    return MAGIC + body + hashlib.md5(body).digest()


def outcome(decoder: Decoder, data: bytes) -> Outcome:
    try:
        return decoder(data)
    except BrokenAggregate:
        return BrokenAggregate


def assert_same(data: bytes) -> Outcome:
    """Both decoders' answer for `data`, asserting it is one answer (the protobuf column decoder's too)."""
    fast, pure = outcome(kpl_protobuf.decode, data), outcome(kpl_python.decode, data)
    assert fast == pure, data.hex()
    try:
        columns: tuple[list[str], list[bytes]] | type[BrokenAggregate] = kpl_protobuf.decode_columns(data)
    except BrokenAggregate:
        columns = BrokenAggregate
    if isinstance(fast, list):
        assert columns == ([record.partition_key for record in fast], [record.data for record in fast]), data.hex()
    else:
        assert columns is BrokenAggregate, data.hex()
    return fast


def random_text(rng: random.Random, max_size: int) -> str:
    return "".join(rng.choice(KEY_ALPHABET) for _ in range(rng.randint(0, max_size)))


def random_record(rng: random.Random, keys: list[str]) -> UserRecord:
    hash_key = rng.choice([None, "0", str(2**128 - 1), str(rng.getrandbits(128))])
    tags = tuple((random_text(rng, 4), rng.choice([None, "", random_text(rng, 4)]))
                 for _ in range(rng.choice([0, 0, 1, 3])))
    data = rng.choice([b"", bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64))), bytes(rng.randint(0, 600)),
                       "".join(rng.choice(string.ascii_letters + "{}:,") for _ in range(rng.randint(1, 80))).encode()])
    return UserRecord(rng.choice(keys), data, hash_key, tags)


def random_aggregate(rng: random.Random) -> list[UserRecord]:
    """User records with random keys, payloads, hash keys and tags; a third of them text only (no hash keys, tags)."""
    keys = [random_text(rng, 12) for _ in range(rng.randint(1, 5))]
    records = [random_record(rng, keys) for _ in range(rng.randint(1, 40))]
    if rng.random() < 1 / 3:
        return [UserRecord(f"key-{index % 7}", record.data.hex().encode()) for index, record in enumerate(records)]
    return records


def corrupt(rng: random.Random, body: bytes) -> bytes:
    """`body` with one random kind of damage: flipped bits, truncation, inserted, deleted or replaced bytes."""
    damaged = bytearray(body)
    kind = rng.randrange(5)
    at = rng.randrange(len(damaged) + 1)
    if kind == 0 and damaged:
        damaged[min(at, len(damaged) - 1)] ^= 1 << rng.randrange(8)
    elif kind == 1:
        del damaged[at:]
    elif kind == 2:
        damaged[at:at] = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 4)))
    elif kind == 3:
        del damaged[at : at + rng.randint(1, 4)]
    else:
        damaged[at : at + 1] = bytes([rng.choice([0x00, 0x08, 0x0A, 0x12, 0x1A, 0x22, 0x7B, 0x7C, 0x80, 0xFF])])
    return bytes(damaged)


@pytest.fixture
def keep_decoder() -> Iterator[None]:
    """Put this process's decoder choice back after a test that changes it."""
    before = kpl_decoding.decoder_name()
    yield
    kpl_decoding.use("auto" if before == "protobuf-upb" else "python")


def test_the_protobuf_decoder_runs_on_the_c_runtime() -> None:
    assert kpl_protobuf.implementation() == "upb"


@pytest.mark.parametrize("seed", range(4))
def test_generated_aggregates_decode_alike(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        records = random_aggregate(rng)
        assert assert_same(encode_aggregate(records)) == records


EDGES = {
    "empty data": [UserRecord("k", b"")],
    "empty partition key": [UserRecord("", b"x")],
    "unicode keys": [UserRecord("ключ-🙂-𝄞", b"\x00\xff", "é"), UserRecord("中", b"y")],
    "explicit hash keys": [UserRecord("k", b"a", str(2**128 - 1)), UserRecord("k", b"b", "0"), UserRecord("j", b"c")],
    "tags": [UserRecord("k", b"a", None, (("", None), ("t", ""), ("🙂", "v")))],
    "one record at Kinesis's size limit": [UserRecord("k", bytes(MAX_KINESIS_RECORD_BYTES - 64))],
    "many tiny records": [UserRecord(f"k{i % 300}", b"") for i in range(20_000)],
}


@pytest.mark.parametrize("records", EDGES.values(), ids=EDGES.keys())
def test_edge_cases_decode_alike(records: list[UserRecord]) -> None:
    assert assert_same(encode_aggregate(records)) == records


@pytest.mark.parametrize("seed", range(4))
def test_corrupted_bodies_are_broken_alike(seed: int) -> None:
    rng = random.Random(1000 + seed)
    broken = 0
    for _ in range(400):
        body = encode_aggregate(random_aggregate(rng))[len(MAGIC) : -DIGEST_SIZE]
        result = assert_same(framed(corrupt(rng, body)))
        broken += result is BrokenAggregate
    assert broken > 100  # the damage reaches the parsers: many inputs are broken, yet both agree on each


@pytest.mark.parametrize("seed", range(2))
def test_damaged_frames_are_broken_alike(seed: int) -> None:
    rng = random.Random(2000 + seed)
    for _ in range(200):
        data = encode_aggregate(random_aggregate(rng))
        assert assert_same(corrupt(rng, data)) is BrokenAggregate or data[:4] == MAGIC


def random_field(rng: random.Random, depth: int = 0) -> bytes:
    """One protobuf field of a random number (mostly the schema's) and wire type, sometimes malformed."""
    number = rng.choice([1, 2, 3, 4, 5, 15, 16, 2**29 - 1])
    wire_type = rng.choice([0, 0, 1, 2, 2, 2, 3, 5, 4, 6])
    tag = encode_varint(number << 3 | wire_type)
    if wire_type == 0:
        return tag + encode_varint(rng.choice([0, 1, 2, 300, 2**63, 2**64 - 1]))
    if wire_type in (1, 5):
        return tag + bytes(8 if wire_type == 1 else 4)
    if wire_type == 2:
        if depth < 3 and rng.random() < 0.5:
            payload = b"".join(random_field(rng, depth + 1) for _ in range(rng.randint(0, 4)))
        else:
            payload = rng.choice([b"", b"x", "é".encode(), b"\xff\xfe", bytes(rng.getrandbits(8) for _ in range(5))])
        return tag + encode_varint(len(payload)) + payload
    if wire_type == 3:
        inner = b"".join(random_field(rng, depth + 1) for _ in range(rng.randint(0, 2))) if depth < 3 else b""
        return tag + inner + encode_varint(number << 3 | 4)
    return tag


def test_random_field_soups_decode_alike() -> None:
    rng = random.Random(7)
    valid = 0
    for _ in range(3000):
        record = b"\x08" + encode_varint(rng.choice([0, 1])) + b"\x1a\x01x"
        fields = [random_field(rng) for _ in range(rng.randint(0, 6))]
        fields.insert(rng.randint(0, len(fields)), b"\x1a" + encode_varint(len(record)) + record)
        fields.insert(0, b"\x0a\x01a")
        valid += assert_same(framed(b"".join(fields))) is not BrokenAggregate
    assert valid > 300


RECORD = b"\x1a\x05\x08\x00\x1a\x01x"  # partition_key_index 0, data "x"
KEY = b"\x0a\x01a"
PROTOBUF_RULES = {
    "known field with another wire type is unknown": (KEY + b"\x08\x05" + RECORD, [UserRecord("a", b"x")]),
    "index sent as fixed64 is unknown, so missing": (KEY + b"\x1a\x0c\x09" + bytes(8) + b"\x1a\x01x", None),
    "well-formed unknown group is skipped": (KEY + b"\x7b\x08\x01\x7c" + RECORD, [UserRecord("a", b"x")]),
    "unclosed group": (KEY + RECORD + b"\x7b", None),
    "group closed by another field": (KEY + RECORD + b"\x7b\x74", None),
    "stray end-group tag": (KEY + RECORD + b"\x0c", None),
    "groups 100 deep": (KEY + RECORD + b"\x7b" * 100 + b"\x7c" * 100, [UserRecord("a", b"x")]),
    "groups 101 deep": (KEY + RECORD + b"\x7b" * 101 + b"\x7c" * 101, None),
    "varint keeps its low 64 bits": (KEY + b"\x1a\x0e\x08" + b"\x80" * 9 + b"\x02\x1a\x01x", [UserRecord("a", b"x")]),
    "11-byte varint": (KEY + b"\x1a\x0f\x08" + b"\x80" * 10 + b"\x00\x1a\x01x", None),
    "5-byte tag below 2**32": (b"\x88\x80\x80\x80\x0f\x00" + KEY + RECORD, [UserRecord("a", b"x")]),
    "5-byte tag at 2**32": (b"\x88\x80\x80\x80\x10\x00" + KEY + RECORD, None),
    "6-byte tag": (b"\x88\x80\x80\x80\x80\x00\x00" + KEY + RECORD, None),
    "field number 0": (KEY + RECORD + b"\x00\x00", None),
    "wire type 6": (KEY + RECORD + b"\x0e", None),
    "tag without key": (KEY + b"\x1a\x09\x08\x00\x1a\x01x\x22\x02\x12\x00", None),
    "non-UTF-8 tag value": (KEY + b"\x1a\x0c\x08\x00\x1a\x01x\x22\x05\x0a\x00\x12\x01\xff", None),
    "non-UTF-8 hash key": (KEY + b"\x12\x01\xff" + RECORD, None),
    "UTF-16 surrogate in a key": (b"\x0a\x03\xed\xa0\x80" + RECORD, None),
    "overlong UTF-8 in a key": (b"\x0a\x02\xc0\x80" + RECORD, None),
    "UTF-8 above U+10FFFF in a key": (b"\x0a\x04\xf4\x90\x80\x80" + RECORD, None),
    "noncharacter U+FFFF in a key": (b"\x0a\x03\xef\xbf\xbf" + RECORD, [UserRecord("\uffff", b"x")]),
    "no records": (KEY, None),
    "overlong hash key index tag without hash keys": (KEY + b"\x1a\x08\x08\x00\x90\x00\x00\x1a\x01x", None),
    "overlong tags tag, tag without key": (KEY + b"\x1a\x0a\x08\x00\x1a\x01x\xa2\x00\x02\x12\x00", None),
    "overlong tags tag, non-UTF-8 key": (KEY + b"\x1a\x0b\x08\x00\x1a\x01x\xa2\x00\x03\x0a\x01\xff", None),
    "overlong tags tag, valid tag": (KEY + b"\x1a\x0b\x08\x00\x1a\x01x\xa2\x00\x03\x0a\x01k",
                                     [UserRecord("a", b"x", None, (("k", None),))]),
    "partition key index out of range": (KEY + b"\x1a\x05\x08\x01\x1a\x01x", None),
    "hash key index without hash keys": (KEY + b"\x1a\x07\x08\x00\x10\x00\x1a\x01x", None),
    "hash key index out of range": (KEY + b"\x12\x01h\x1a\x07\x08\x00\x10\x01\x1a\x01x", None),
    "hash key index in range": (KEY + b"\x12\x01h" + RECORD + b"\x1a\x07\x08\x00\x10\x00\x1a\x01y",
                                [UserRecord("a", b"x"), UserRecord("a", b"y", "h")]),
    "last of a repeated scalar wins": (KEY + b"\x0a\x01b\x1a\x0a\x08\x05\x08\x01\x1a\x01x\x1a\x01y",
                                       [UserRecord("b", b"y")]),
}


@pytest.mark.parametrize(("body", "expected"), PROTOBUF_RULES.values(), ids=PROTOBUF_RULES.keys())
def test_protobuf_parsing_rules(body: bytes, expected: list[UserRecord] | None) -> None:
    assert assert_same(framed(body)) == (BrokenAggregate if expected is None else expected)


def decoder_in_subprocess(env_value: str | None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != kpl_decoding.DECODER_ENV}
    if env_value is not None:
        env[kpl_decoding.DECODER_ENV] = env_value
    return subprocess.run([sys.executable, "-c", "from agent import kpl_decoding; print(kpl_decoding.decoder_name())"],
                          env=env, capture_output=True, text=True, check=False)


def test_decoder_is_chosen_from_the_environment_and_can_be_forced_to_python() -> None:
    assert decoder_in_subprocess(None).stdout.strip() == "protobuf-upb"
    assert decoder_in_subprocess("Python").stdout.strip() == "python"
    bad = decoder_in_subprocess("fast")
    assert bad.returncode != 0 and "SHARDHERD_KPL_DECODER must be one of" in bad.stderr


def test_the_setting_offers_the_decoders_choices() -> None:
    assert get_args(Settings.model_fields["kpl_decoder"].annotation) == KPL_DECODERS
    assert load_settings(stream_name="s", kpl_decoder="python").kpl_decoder == "python"
    with pytest.raises(ConfigError, match="kpl_decoder"):
        load_settings(stream_name="s", kpl_decoder="fast")


@pytest.mark.usefixtures("keep_decoder")
def test_use_switches_the_decoder_in_process() -> None:
    data = encode_aggregate([UserRecord("k", b"v")])
    assert kpl_decoding.use("python") == "python"
    assert kpl_decoding.decode_aggregate(data) == [UserRecord("k", b"v")]
    assert kpl_decoding.decode_columns(data) == (["k"], [b"v"])
    assert kpl_decoding.use("auto") == "protobuf-upb"
    assert kpl_decoding.decode_aggregate(data) == [UserRecord("k", b"v")]
    assert kpl_decoding.decode_columns(data) == (["k"], [b"v"])
    with pytest.raises(ValueError, match="must be one of"):
        kpl_decoding.use("c")


@pytest.mark.usefixtures("keep_decoder")
def test_an_agents_auto_decodes_in_python_until_its_records_pay_for_the_c_decoder() -> None:
    data = encode_aggregate([UserRecord("k", b"v"), UserRecord("j", b"w", "7")])
    assert kpl_decoding.use("auto", after=5) == "python"
    for decoded in (2, 4):  # two user records an aggregate
        assert kpl_decoding.decode_aggregate(data) == [UserRecord("k", b"v"), UserRecord("j", b"w", "7")]
        assert kpl_decoding.decoder_name() == "python", decoded
    assert kpl_decoding.decode_columns(data) == (["k", "j"], [b"v", b"w"])  # the 6th: past 5, it switches
    assert kpl_decoding.decoder_name() == "protobuf-upb"
    assert kpl_decoding.decode_aggregate(data) == [UserRecord("k", b"v"), UserRecord("j", b"w", "7")]
    assert kpl_decoding.use("auto", after=5) == "protobuf-upb"  # the same choice again: no new wait
    assert kpl_decoding.use("auto") == "protobuf-upb"


def test_a_process_imports_no_protobuf_until_its_decoder_is_needed() -> None:
    probe = ("import sys; from agent import kpl_decoding, kpl; from agent.runtime import Agent; "
             "before = 'google.protobuf' in sys.modules; kpl_decoding.use('auto', after=1); "
             "waiting = 'google.protobuf' in sys.modules; "
             "kpl_decoding.decode_aggregate(kpl.encode_aggregate([kpl.UserRecord('k', b'v')])); "
             "print(before, waiting, 'google.protobuf' in sys.modules, kpl_decoding.decoder_name())")
    env = {key: value for key, value in os.environ.items() if key != kpl_decoding.DECODER_ENV}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False", "True", "protobuf-upb"]


@pytest.mark.usefixtures("keep_decoder")
def test_an_agent_applies_its_kpl_decoder_setting_and_logs_it(caplog: pytest.LogCaptureFixture) -> None:
    settings = load_settings(stream_name="s", kpl_decoder="python", kinesis_endpoint_url="http://127.0.0.1:9",
                             disable_worker_metrics=True)
    agent = Agent(settings, lambda: pytest.fail("no shard is held"), store=MemoryLeaseStore(settings.table_names))
    assert agent.kpl_decoder == kpl_decoding.decoder_name() == "python"
    with caplog.at_level(logging.INFO, logger="shardherd.agent.runtime"):
        agent.start()
        agent.stop(drain=False)
    assert "de-aggregated by the python decoder (kpl_decoder=python)" in caplog.text


@pytest.mark.usefixtures("keep_decoder")
def test_an_executor_read_applies_the_decoder_its_partition_carries(tmp_path: Path) -> None:
    plan = ShardPlan("shardId-0", StartPosition.after(Checkpoint("1")))
    for choice, name in (("python", "python"), ("auto", "protobuf-upb")):
        options = SourceOptions(tmp_path, "stream", endpoint_url="http://127.0.0.1:9", kpl_decoder=choice)
        read_partition(ShardPartition((plan,), options))  # a lazy iterator: nothing is read until Spark pulls rows
        assert kpl_decoding.decoder_name() == name
