"""`shardherd status`, `shardherd drain` and `shardherd plan`: the operator API from a terminal, over httpx."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from rich.console import Console
from rich.table import Table

from shared.config import Settings, load_settings
from shared.errors import ShardherdError


class ApiError(ShardherdError):
    """The coordinator API could not be reached or answered with an error."""


class OperatorClient:
    """A small client of the operator API; every failure is an ApiError with the server's reason."""

    def __init__(self, url: str, token: str | None, timeout: float = 10.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def call(self, method: str, path: str, **params: Any) -> Any:
        """One request; the decoded JSON body."""
        try:
            response = self._http.request(method, path, params=params or None)
        except httpx.HTTPError as exc:
            raise ApiError(f"cannot reach the coordinator at {self.url}: {exc}") from exc
        if response.is_error:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ApiError(f"{method} {path}: HTTP {response.status_code}: {detail}")
        return response.json()

    def leases(self) -> list[dict[str, Any]]:
        """Every lease, following the pagination cursor."""
        items: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if cursor:
                params["cursor"] = cursor
            page = self.call("GET", "/v1/assignments", **params)
            items += page["items"]
            cursor = page["next_cursor"]
            if not cursor:
                return items


def _token(args: argparse.Namespace, settings: Settings) -> str | None:
    path = args.token_file or (None if settings.api_token else settings.api_token_file)
    if path is None:
        return settings.api_token.get_secret_value() if settings.api_token is not None else None
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ApiError(f"cannot read the token file {path}: {exc.strerror}") from exc


def client_for(args: argparse.Namespace) -> OperatorClient:
    """A client for `--url` (else `coordinator_url`, else this host's api_port) with the configured token."""
    settings = load_settings()
    url = args.url or settings.coordinator_url or f"http://127.0.0.1:{settings.api_port}"
    return OperatorClient(url, _token(args, settings), args.timeout)


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def show_status(client: OperatorClient, console: Console) -> None:
    """Print the leader line, the workers table and the leases table."""
    leader = client.call("GET", "/v1/leader")
    lock = leader["lock"]
    freshness = "stale" if leader["stale"] else "fresh"
    console.print(f"leader: [bold]{lock['owner'] or '-'}[/bold] epoch {lock['epoch'] or '-'} "
                  f"(last good run {_number(leader['last_success_age_seconds'])} s ago, {freshness})",
                  highlight=False)
    workers = Table(title="workers")
    for column in ("worker", "state", "cpu ema %", "leases", "KiB/s", "heartbeat age s"):
        workers.add_column(column, overflow="fold")
    for worker in client.call("GET", "/v1/workers")["items"]:
        workers.add_row(worker["worker_id"], worker["state"], _number(worker["cpu_ema"]), str(worker["lease_count"]),
                        _number(worker["throughput_kbps"]), _number(worker["heartbeat_age_seconds"]))
    console.print(workers)
    leases = Table(title="leases")
    for column in ("lease", "owner", "checkpoint owner", "state", "KiB/s", "checkpoint"):
        leases.add_column(column, overflow="fold")
    for lease in client.leases():
        leases.add_row(lease["lease_key"], lease["owner"] or "-", lease["checkpoint_owner"] or "-", lease["state"],
                       _number(lease["throughput_kbps"]), lease["checkpoint"])
    console.print(leases)


def show_plan(client: OperatorClient, console: Console) -> None:
    """Print what the decider would do now."""
    plan = client.call("POST", "/v1/plan")
    console.print(f"dry run ({plan['strategy']}, balancing run); nothing was written", highlight=False)
    moves = Table(title=f"{len(plan['moves'])} moves")
    for column in ("lease", "from", "to", "reason", "detail"):
        moves.add_column(column, overflow="fold")
    for move in plan["moves"]:
        moves.add_row(move["lease_key"], move["from_owner"] or "-", move["to_worker"], move["reason"], move["detail"])
    console.print(moves)
    unplaced = plan["spillover"] + plan["held"]
    if unplaced:
        table = Table(title=f"{len(unplaced)} leases not placed")
        for column in ("lease", "keeps owner", "reason", "detail"):
            table.add_column(column, overflow="fold")
        for item in unplaced:
            table.add_row(item["lease_key"], item["owner"] or "-", item["reason"], item["detail"])
        console.print(table)


def _connection_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="coordinator API base URL (default: coordinator_url, else 127.0.0.1:api_port)")
    parser.add_argument("--token-file", help="file holding the API token (default: api_token / api_token_file)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request")


def register(sub: Any) -> None:
    """Add the `status`, `drain` and `plan` subcommands."""
    status = sub.add_parser("status", help="show the leader, workers and leases (from the coordinator API)")
    _connection_args(status)
    status.set_defaults(run=lambda args: _run(args, show_status))
    drain = sub.add_parser("drain", help="ask the leader to move every lease off a worker")
    drain.add_argument("worker", help="the worker id")
    drain.add_argument("--undo", action="store_true", help="clear the drain flag instead")
    _connection_args(drain)
    drain.set_defaults(run=run_drain)
    plan = sub.add_parser("plan", help="show what the leader would do now (dry run, no writes)")
    _connection_args(plan)
    plan.set_defaults(run=lambda args: _run(args, show_plan))


def _run(args: argparse.Namespace, show: Callable[[OperatorClient, Console], None]) -> int:
    client = client_for(args)
    try:
        show(client, Console())
    finally:
        client.close()
    return 0


def run_drain(args: argparse.Namespace) -> int:
    """Set (or with --undo clear) the worker's drain flag."""
    client = client_for(args)
    try:
        action = "undrain" if args.undo else "drain"
        body = client.call("POST", f"/v1/workers/{quote(args.worker, safe='')}/{action}")
    finally:
        client.close()
    state = "requested" if body["drain_requested"] else "cleared"
    print(f"drain {state} for {body['worker_id']}")
    return 0
