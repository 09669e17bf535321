"""`shardherd pause`, `resume` and `rewind`: the operator controls of issue 34, through the coordinator API.

Each needs the admin token (found as `shardherd drain` finds it). Errors are one line and exit code 2 (services/cli.py);
a rewind prints one line per shard: its checkpoint before and after, and how the new one was chosen.
"""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from shardherd.services.status_cli import _connection_args, client_for


def register(sub: Any) -> None:
    """Add the `pause`, `resume` and `rewind` subcommands."""
    for name, text in (("pause", "pause shards: the owner checkpoints what it delivered and stops reading"),
                       ("resume", "resume paused shards from their checkpoints")):
        parser = sub.add_parser(name, help=text)
        parser.add_argument("shards", nargs="*", metavar="SHARD", help="lease keys or shard ids")
        parser.add_argument("--stream", action="append", default=[],
                            help="every shard of this stream (multi-stream applications; repeat)")
        if name == "pause":
            parser.add_argument("--reason", help="why (shown on the dashboard and in the lease row)")
        _connection_args(parser)
        parser.set_defaults(run=run_pause, action=name)
    rewind = sub.add_parser("rewind", help="rewind (or fast-forward) shards to a time, online and fenced")
    rewind.add_argument("--to", help="ISO 8601 time, e.g. 2026-11-28T10:00:00Z (UTC if no zone)")
    rewind.add_argument("--to-sequence", action="append", default=[], metavar="SHARD=SEQUENCE",
                        help="checkpoint this shard at this sequence number (repeat)")
    rewind.add_argument("--streams", nargs="+", default=[], help="only these streams")
    rewind.add_argument("--shards", nargs="+", default=[], help="only these shards (default: every shard)")
    rewind.add_argument("--dry-run", action="store_true", help="print the per-shard table, write nothing")
    _connection_args(rewind)
    rewind.set_defaults(run=run_rewind, timeout=60.0)


def run_pause(args: argparse.Namespace) -> int:
    """Pause or resume the named shards; one line per lease changed."""
    client = client_for(args)
    params: dict[str, Any] = {"shard": args.shards, "stream": args.stream}
    if getattr(args, "reason", None):
        params["reason"] = args.reason
    try:
        body = client.call("POST", f"/v1/{args.action}", **params)
    finally:
        client.close()
    for lease in body["leases"]:
        state = f"paused ({lease['paused']})" if lease["paused"] else "running"
        print(f"{lease['lease_key']}: {state}, owner {lease['owner'] or '-'}")
    return 0


def run_rewind(args: argparse.Namespace) -> int:
    """Run (or with --dry-run plan) a rewind and print its record."""
    client = client_for(args)
    params: dict[str, Any] = {"to_sequence": args.to_sequence, "shard": args.shards, "stream": args.streams,
                              "dry_run": args.dry_run, "who": getpass.getuser()}
    if args.to:
        params["to"] = args.to
    try:
        record = client.call("POST", "/v1/rewind", **params)
    finally:
        client.close()
    done = "dry run, nothing written" if record["dry_run"] else record["outcome"]
    print(f"rewind {record['rewind_id']} to {record['to']}: {done}")
    for row in record["rows"]:
        print(f"  {row['lease_key']}: {row['before']} -> {row['after']} ({row['note']})")
    return 0
