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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered (the development ones where they are installed)."""
    from shardherd.services import (
        agent_service,
        check_table,
        controls_cli,
        coordinator_service,
        dlq_cli,
        multilang_service,
        status_cli,
    )

    parser = argparse.ArgumentParser(prog="shardherd", description="Kinesis shard lease coordination.")
    sub = parser.add_subparsers(dest="command", required=True)
    agent_service.register(sub)
    check_table.register(sub)
    controls_cli.register(sub)
    coordinator_service.register(sub)
    dlq_cli.register(sub)
    multilang_service.register(sub)
    status_cli.register(sub)
    for name in DEV_COMMANDS:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; ShardherdError, and any AWS (or emulator) error, becomes one message and exit code 2."""
    from botocore.exceptions import BotoCoreError, ClientError

    parser = build_parser()
    args = parser.parse_args(argv)
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
