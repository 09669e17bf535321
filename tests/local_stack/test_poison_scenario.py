"""`scenario poison`'s parts that need no stack: the processor's rule, the refusals, the key tail (decision 0031).

The scenario itself runs on the live stacks of test_up.py (quarantine) and test_up_guards.py (block).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardherd.agent.records import Record
from shardherd.services.cli import main
from shardherd.services.local_stack.control_scenarios import ControlScenarios
from shardherd.services.local_stack.poison_scenario import POISON_DATA, KeyTail, PoisonScenario
from shardherd.services.local_stack.processor import NotAProducerRecord, check_record
from shardherd.services.local_stack.scenarios import ScenarioFailed, Scenarios
from shardherd.services.local_stack.stack import StackOptions
from shardherd.services.local_stack.state import StackState
from shardherd.shared.errors import ConfigError


def _record(data: bytes) -> Record:
    return Record("shardId-000000000003", "49590338271490256608559692538361571095921575989136588898", 2, "k", None,
                  None, data, False)


def test_the_plain_processor_takes_what_the_producer_writes_and_rejects_anything_else() -> None:
    check_record(_record(json.dumps({"n": 7, "key": "key-0001", "t": 1764370000.5}).encode()))
    for data in (POISON_DATA, b"", b"[1, 2]", b'{"n": 7}', b"\xff\xfe"):
        with pytest.raises(NotAProducerRecord) as raised:
            check_record(_record(data))
        assert str(raised.value).startswith("record 49590338271490256608559692538361571095921575989136588898/2 of "
                                            "shardId-000000000003 is not a producer record")


def test_a_poison_policy_needs_plain_agents_and_one_of_the_two_policies(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--poison-policy needs plain agents"):
        StackOptions(run_dir=tmp_path, spark=True, poison_policy="quarantine")
    with pytest.raises(ConfigError, match="block or quarantine"):
        StackOptions(run_dir=tmp_path, spark=False, poison_policy="skip")
    assert StackOptions(run_dir=tmp_path, spark=False, poison_policy="quarantine").dead_letter_dir == (
        tmp_path / "dead-letters")


def test_the_scenario_refuses_a_spark_stack_with_one_line_before_writing(tmp_path: Path) -> None:
    state = StackState(1, "app", "stream", "us-east-1", "http://127.0.0.1:1", "http://127.0.0.1:1",
                       "http://127.0.0.1:1/", str(tmp_path / "control.sock"), None, spark=True)
    scenario = PoisonScenario(ControlScenarios(Scenarios(state, 5.0), tmp_path / "plain-records"))
    with pytest.raises(ScenarioFailed, match=r"needs plain agents \(`shardherd up --no-spark`\)"):
        scenario.run(None)  # no emulator listens on port 1: it stopped before any call


def test_an_unknown_policy_is_refused_by_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["up", "--no-spark", "--poison-policy", "skip"])
    assert "invalid choice: 'skip'" in capsys.readouterr().err


def test_the_key_tail_reads_only_complete_new_lines_of_its_shard(tmp_path: Path) -> None:
    (tmp_path / "agent-1").mkdir()
    (tmp_path / "agent-2").mkdir()
    tail = KeyTail(tmp_path, "shardId-000000000001")
    assert tail.read() == -1
    (tmp_path / "agent-1" / "shardId-000000000001.keys").write_text("100 0\n205 1\n")
    (tmp_path / "agent-2" / "shardId-000000000002.keys").write_text("999 0\n")  # another shard
    assert tail.read() == 205
    with (tmp_path / "agent-2" / "shardId-000000000001.keys").open("w") as keys:
        keys.write("300 0\n41")  # a line being written counts once it ends
    assert tail.read() == 300
    with (tmp_path / "agent-2" / "shardId-000000000001.keys").open("a") as keys:
        keys.write("0 0\n")
    assert tail.read() == 410
