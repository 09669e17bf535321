"""Where the shared options of `shardherd scenario` go: before the scenario's name or after it, as for `status`."""

from __future__ import annotations

import pytest

from shardherd.services.cli import build_parser


@pytest.mark.parametrize("argv", [
    ["scenario", "--run-dir", "/tmp/stack", "--timeout", "5", "kill-agent", "agent-1"],
    ["scenario", "kill-agent", "agent-1", "--run-dir", "/tmp/stack", "--timeout", "5"],
    ["scenario", "--timeout", "5", "kill-agent", "--run-dir", "/tmp/stack", "agent-1"],
])
def test_scenario_takes_run_dir_before_or_after_the_scenario(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.action, args.name, args.run_dir, args.timeout) == ("kill-agent", "agent-1", "/tmp/stack", 5.0)


@pytest.mark.parametrize("action", [["add-agent"], ["kill-leader"], ["drain", "w"], ["split", "s"], ["merge", "a", "b"],
                                    ["hot-shard", "s"]])
def test_every_scenario_takes_run_dir_after_its_name_and_keeps_the_defaults(action: list[str]) -> None:
    assert build_parser().parse_args(["scenario", *action, "--run-dir", "d"]).run_dir == "d"
    default = build_parser().parse_args(["scenario", *action])
    assert (default.run_dir, default.timeout) == (None, 90.0)


def test_status_and_drain_take_run_dir_after_their_name() -> None:
    assert build_parser().parse_args(["status", "--run-dir", "d"]).run_dir == "d"
    assert build_parser().parse_args(["drain", "w", "--run-dir", "d"]).run_dir == "d"
