"""Where the shared options of `shardherd scenario` go: before the scenario's name or after it, as for `status`; which
module each subcommand comes from (one command imports its own module only)."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from shardherd.services.cli import COMMANDS, build_parser


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


def test_the_command_table_names_every_subcommand_its_module_registers() -> None:
    for module in set(COMMANDS.values()):
        parser = argparse.ArgumentParser()
        importlib.import_module(module).register(parser.add_subparsers())
        (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        assert {name for name, owner in COMMANDS.items() if owner == module} == set(action.choices), module


def test_one_command_imports_its_own_module_only() -> None:
    script = ("import sys; from shardherd.services.cli import build_parser; "
              "args = build_parser('multilang').parse_args(['multilang', '--properties', 'app.properties']); "
              "print(args.run.__module__, *sorted(m for m in ('sqlalchemy', 'shardherd.services.up_cli', "
              "'shardherd.services.check_table', 'shardherd.services.status_cli') if m in sys.modules))")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert shown.stdout.split() == ["shardherd.services.multilang_service"]
