"""The `shardherd` command line: one entry point, one subcommand per runnable process or tool."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
from collections.abc import Sequence

from shardherd.shared.errors import ShardherdError

# When this command started (its first import, before the subcommands' imports): what `up --duration` and its start-up
# figures count from. Not the process's create time, which in `bash -c "pip install ... && shardherd up"` is the
# shell's, before the whole chain.
STARTED = time.time()

# Development tooling: in the package, not in the images (.dockerignore), so registered only where it is installed.
DEV_COMMANDS = ("shardherd.services.demo", "shardherd.services.up_cli")

# The module that registers each subcommand. `shardherd X` imports X's module only: a `shardherd multilang` worker
# does not hold the other commands' imports (`up`'s SQLAlchemy and local stack, the CLIs' clients: 16 MB of its
# resident memory). Any other first argument (none, --help, a typo) registers every command, so argparse lists them.
COMMANDS = {
    "agent": "shardherd.services.agent_service",
    "check-table": "shardherd.services.check_table",
    "pause": "shardherd.services.controls_cli",
    "resume": "shardherd.services.controls_cli",
    "rewind": "shardherd.services.controls_cli",
    "coordinator": "shardherd.services.coordinator_service",
    "dlq": "shardherd.services.dlq_cli",
    "multilang": "shardherd.services.multilang_service",
    "status": "shardherd.services.status_cli",
    "drain": "shardherd.services.status_cli",
    "plan": "shardherd.services.status_cli",
    "demo": "shardherd.services.demo",
    "up": "shardherd.services.up_cli",
    "scenario": "shardherd.services.up_cli",
    "mark-removal": "shardherd.services.removal_cli",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with `command`'s subcommands, or every one's when `command` is not one of them.

    The development commands are registered only where their modules are installed.
    """
    # Every module once, in the table's order, unless one command was named.
    modules = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    parser = argparse.ArgumentParser(prog="shardherd", description="Kinesis shard lease coordination.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in modules:
        if name not in DEV_COMMANDS or importlib.util.find_spec(name) is not None:
            importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; ShardherdError, and any AWS (or emulator) error, becomes one message and exit code 2."""
    from botocore.exceptions import BotoCoreError, ClientError

    arguments = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(arguments[0] if arguments else None)
    args = parser.parse_args(arguments)
    try:
        code: int = args.run(args)
    except ShardherdError as exc:
        print(f"shardherd: {exc}", file=sys.stderr)
        return 2
    except ClientError as exc:
        error = exc.response.get("Error", {})
        print(f"shardherd: AWS refused {exc.operation_name}: {error.get('Code')}: {error.get('Message')}",
              file=sys.stderr)
        return 2
    except BotoCoreError as exc:
        print(f"shardherd: AWS: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
