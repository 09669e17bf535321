"""`shardherd demo`: a short walk through the lease store protocol on a real store, printed step by step."""

from __future__ import annotations

import argparse
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from shardherd.shared.checkpoint import TRIM_HORIZON, Checkpoint
from shardherd.shared.config import load_settings
from shardherd.shared.lease import Lease, new_lease
from shardherd.shared.store import LeaseStore
from shardherd.shared.store_factory import open_store


def register(sub: Any) -> None:
    """Add the `demo` subcommand."""
    parser = sub.add_parser("demo", help="walk through leases, handoff and checkpoints on a real store")
    parser.add_argument("--backend", choices=["sqlite", "dynamodb"], default="sqlite",
                        help="sqlite (embedded) or dynamodb (a moto server started on 127.0.0.1)")
    parser.add_argument("--shards", type=int, default=4)
    parser.set_defaults(run=run)


def _show(store: LeaseStore, title: str) -> None:
    print(f"\n-- {title}")
    print(f"{'lease':<22} {'owner':<10} {'cp owner':<10} {'counter':>7}  checkpoint")
    for lease in sorted(store.scan_leases().leases, key=lambda item: item.lease_key):
        print(f"{lease.lease_key:<22} {lease.lease_owner or '-':<10} {lease.checkpoint_owner or '-':<10} "
              f"{lease.lease_counter:>7}  {lease.checkpoint}")


def _walk(store: LeaseStore, shards: int) -> None:
    store.ensure_tables()
    keys = [f"shardId-{index:012d}" for index in range(shards)]
    for key in keys:
        store.create_lease(new_lease(key, TRIM_HORIZON))
    _show(store, "shard sync created one lease per shard")
    for index, key in enumerate(keys):
        store.assign(key, f"worker-{index % 2}", None, None)
    _show(store, "the leader assigned them to two workers")
    first = keys[0]
    moved = store.start_handoff(first, "worker-1", "worker-0")
    print(f"\nhandoff of {first} to worker-1 started: applied={moved.applied}")
    position = Checkpoint.at("49590338271490256608559692538361571095921575989136588898")
    denied = store.checkpoint(first, "worker-1", position)
    print(f"the next owner may not checkpoint yet: applied={denied.applied} ({denied.conflict.value})")
    done = store.checkpoint(first, "worker-0", position)
    print(f"the draining owner checkpoints: applied={done.applied}")
    back = store.checkpoint(first, "worker-0", Checkpoint.at("4959"))
    print(f"a checkpoint that moves backwards is refused: applied={back.applied} ({back.conflict.value})")
    store.complete_handoff(first, "worker-0")
    _show(store, "handoff complete")
    owned: list[Lease] = [lease for lease in store.scan_leases().leases if lease.lease_owner == "worker-1"]
    print(f"\nworker-1 finds {len(store.list_owned_keys('worker-1'))} leases through the owner index "
          f"({len(owned)} by scan)")


def run(args: argparse.Namespace) -> int:
    """Run the demo against an embedded SQLite file or a moto server started for the occasion."""
    with ExitStack() as stack:
        if args.backend == "dynamodb":
            from shardherd.services.emulators.moto_server import MotoServer

            server = stack.enter_context(MotoServer())
            settings = load_settings(store_backend="dynamodb", dynamodb_endpoint_url=server.endpoint_url,
                                     application_name="shardherd-demo")
        else:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            settings = load_settings(store_backend="sql", sql_url=f"sqlite:///{folder / 'demo.db'}",
                                     application_name="shardherd-demo")
        store = open_store(settings)
        stack.callback(store.close)
        _walk(store, args.shards)
    return 0
