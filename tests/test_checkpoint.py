"""The checkpoint value type: validation, numeric total ordering, sentinels, round trips through stored values."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardherd.shared.checkpoint import (
    AT_TIMESTAMP,
    LATEST,
    MAX_SEQUENCE_DIGITS,
    SHARD_END,
    TRIM_HORIZON,
    Checkpoint,
    Sentinel,
    parse_checkpoint,
)
from shardherd.shared.errors import InvalidCheckpoint

SETTINGS = settings(max_examples=300, derandomize=True, deadline=None)
LARGEST = 10**MAX_SEQUENCE_DIGITS - 1

sequence_values = st.one_of(
    st.integers(min_value=0, max_value=LARGEST),
    st.integers(min_value=10**128 - 50, max_value=10**128 + 50),  # around the 128/129-digit boundary
    st.integers(min_value=0, max_value=200),
)
sub_sequences = st.integers(min_value=0, max_value=2**63)
numbered = st.builds(lambda value, sub: Checkpoint.at(str(value), sub), sequence_values, sub_sequences)
initial = st.sampled_from([TRIM_HORIZON, LATEST, AT_TIMESTAMP])
any_checkpoint = st.one_of(numbered, initial, st.just(SHARD_END))


def rank(checkpoint: Checkpoint) -> tuple[int, int, int]:
    """The documented order, written independently: initial sentinels, then (number, sub), then SHARD_END."""
    if checkpoint.sequence_number == "SHARD_END":
        return (2, 0, 0)
    if checkpoint.sequence_number in ("TRIM_HORIZON", "LATEST", "AT_TIMESTAMP"):
        return (0, 0, 0)
    return (1, int(checkpoint.sequence_number), checkpoint.sub_sequence_number)


@SETTINGS
@given(numbered, numbered)
def test_order_of_sequence_numbers_is_the_integer_order(a: Checkpoint, b: Checkpoint) -> None:
    expected = (int(a.sequence_number), a.sub_sequence_number) < (int(b.sequence_number), b.sub_sequence_number)
    assert (a < b) is expected
    assert (a > b) is ((int(b.sequence_number), b.sub_sequence_number)
                       < (int(a.sequence_number), a.sub_sequence_number))


@SETTINGS
@given(st.one_of(numbered, st.just(SHARD_END), st.just(TRIM_HORIZON)),
       st.one_of(numbered, st.just(SHARD_END), st.just(TRIM_HORIZON)))
def test_order_is_total(a: Checkpoint, b: Checkpoint) -> None:
    assert sum([a < b, a == b, a > b]) == 1
    assert (a <= b) or (b <= a)
    assert (a <= b) is (not a > b)


@SETTINGS
@given(any_checkpoint, any_checkpoint)
def test_order_matches_the_documented_ranking(a: Checkpoint, b: Checkpoint) -> None:
    assert (a < b) is (rank(a) < rank(b))
    assert (b < a) is (rank(a) > rank(b))


@SETTINGS
@given(st.lists(any_checkpoint, min_size=1, max_size=20))
def test_sorting_agrees_with_the_ranking(checkpoints: list[Checkpoint]) -> None:
    assert [rank(checkpoint) for checkpoint in sorted(checkpoints)] == sorted(rank(c) for c in checkpoints)
    assert rank(max(checkpoints)) == max(rank(checkpoint) for checkpoint in checkpoints)


@SETTINGS
@given(any_checkpoint, any_checkpoint)
def test_regression_means_moving_down_the_order(current: Checkpoint, new: Checkpoint) -> None:
    assert new.regresses_from(current) is (rank(new) < rank(current))


@SETTINGS
@given(numbered)
def test_nothing_but_shard_end_follows_shard_end(checkpoint: Checkpoint) -> None:
    assert checkpoint.regresses_from(SHARD_END)
    assert not SHARD_END.regresses_from(SHARD_END)
    assert not SHARD_END.regresses_from(checkpoint)


@SETTINGS
@given(any_checkpoint)
def test_stored_values_round_trip(checkpoint: Checkpoint) -> None:
    sub = checkpoint.sub_sequence_number
    for stored_sub in (sub, str(sub), Decimal(sub)):  # DynamoDB numbers come back as strings or Decimals
        assert parse_checkpoint(checkpoint.sequence_number, stored_sub) == checkpoint
    if sub == 0:
        assert parse_checkpoint(checkpoint.sequence_number) == checkpoint


@SETTINGS
@given(any_checkpoint)
def test_str_shows_the_number_and_the_sub_sequence(checkpoint: Checkpoint) -> None:
    text = str(checkpoint)
    number, _, sub = text.partition("/")
    assert number == checkpoint.sequence_number
    assert int(sub or "0") == checkpoint.sub_sequence_number
    assert parse_checkpoint(number, sub or None) == checkpoint


@SETTINGS
@given(sequence_values)
def test_sequence_value_is_the_integer(value: int) -> None:
    checkpoint = Checkpoint.at(value)
    assert checkpoint.sequence_value == value
    assert checkpoint.sentinel is None
    assert not checkpoint.is_initial and not checkpoint.is_shard_end


@pytest.mark.parametrize("sentinel", list(Sentinel))
def test_sentinels(sentinel: Sentinel) -> None:
    checkpoint = Checkpoint.of(sentinel)
    assert checkpoint.sentinel is sentinel
    assert checkpoint.sequence_value is None
    assert checkpoint.is_shard_end is (sentinel is Sentinel.SHARD_END)
    assert checkpoint.is_initial is (sentinel is not Sentinel.SHARD_END)
    assert parse_checkpoint(sentinel.value, 0) == checkpoint


def test_kcl_example_order() -> None:
    assert Checkpoint.at("99") < Checkpoint.at("100")
    assert Checkpoint.at("100", 1) > Checkpoint.at("100")
    assert TRIM_HORIZON < Checkpoint.at("0") < Checkpoint.at("9" * 129) < SHARD_END


BAD_SEQUENCE_NUMBERS = [
    "",
    "-1",
    "+1",
    " 1",
    "1 ",
    "1.0",
    "1e5",
    "0x10",
    "1_000",
    "\u0663",  # ARABIC-INDIC DIGIT THREE: int() accepts it, KCL does not
    "\uff11\uff12",  # fullwidth digits
    "9" * (MAX_SEQUENCE_DIGITS + 1),
    "trim_horizon",
    "SHARD_END ",
    "AT_SEQUENCE_NUMBER",
]


@pytest.mark.parametrize("text", BAD_SEQUENCE_NUMBERS)
def test_invalid_sequence_strings_raise(text: str) -> None:
    with pytest.raises(InvalidCheckpoint):
        Checkpoint(text)
    with pytest.raises(InvalidCheckpoint):
        parse_checkpoint(text, 0)


@SETTINGS
@given(st.text(min_size=1, max_size=140).filter(
    lambda text: not (text.isascii() and text.isdigit() and len(text) <= MAX_SEQUENCE_DIGITS)
    and text not in Sentinel.__members__))
def test_any_other_text_raises(text: str) -> None:
    with pytest.raises(InvalidCheckpoint):
        parse_checkpoint(text)


@pytest.mark.parametrize(("sequence", "sub"), [
    ("5", -1), ("5", "-1"), ("5", "1.5"), ("5", "x"), ("5", True), ("5", 2.0), ("SHARD_END", 1),
    ("TRIM_HORIZON", "3"),
])
def test_invalid_sub_sequences_raise(sequence: str, sub: object) -> None:
    with pytest.raises(InvalidCheckpoint):
        parse_checkpoint(sequence, sub)


@pytest.mark.parametrize("value", [5, None, b"5", 5.0])
def test_non_string_sequence_numbers_raise(value: object) -> None:
    with pytest.raises(InvalidCheckpoint):
        parse_checkpoint(value)


@pytest.mark.parametrize("sub", [-1, True, 1.0])
def test_constructor_rejects_bad_sub_sequences(sub: object) -> None:
    with pytest.raises(InvalidCheckpoint):
        Checkpoint("5", sub)  # type: ignore[arg-type]


def test_sentinel_with_sub_sequence_is_rejected() -> None:
    with pytest.raises(InvalidCheckpoint):
        Checkpoint("LATEST", 1)


@pytest.mark.parametrize(("a", "b"), [(TRIM_HORIZON, LATEST), (Checkpoint.at("012"), Checkpoint.at("12"))])
def test_values_of_equal_rank_are_comparable(a: Checkpoint, b: Checkpoint) -> None:
    assert not (a > b and b > a)
    assert a <= b or b <= a
