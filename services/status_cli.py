"""`shardherd status`, `shardherd drain` and `shardherd plan`: the operator API from a terminal, over httpx."""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from rich import box
from rich.console import Console
from rich.table import Table

from shardherd.shared.config import Settings, load_settings
from shardherd.shared.errors import ShardherdError
from shardherd.shared.lean_httpx import httpx
from shardherd.shared.restart import parse_window

if TYPE_CHECKING:
    from shardherd.services.local_stack.state import StackState

NARROW = 80
WIDE = 120
COLUMN_GAP = 3
CHECKPOINT_ENDS = 8  # digits kept at each end of a long checkpoint in `--wide`


class ApiError(ShardherdError):
    """The coordinator API could not be reached or answered with an error (`status` None: not reached)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class OperatorClient:
    """A small client of the operator API over one or more replicas; every failure is an ApiError with the reason.

    A replica that cannot be reached or answers 5xx is skipped for the next one (every replica serves the same API
    from the same store); the one that answered is tried first next time. 4xx answers are final.
    """

    def __init__(self, url: str | Sequence[str], token: str | None, timeout: float = 10.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.urls = [item.rstrip("/") for item in ([url] if isinstance(url, str) else url)]
        if not self.urls:
            raise ApiError("no coordinator API URL to try")
        self._http = httpx.Client(headers=headers, timeout=timeout)

    @property
    def url(self) -> str:
        """The replica tried first (the last one that answered)."""
        return self.urls[0]

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def call(self, method: str, path: str, **params: Any) -> Any:
        """One request, failing over between replicas; the decoded JSON body."""
        problems: list[str] = []
        for url in list(self.urls):
            try:
                body = self._call(url, method, path, params)
            except ApiError as exc:
                if exc.status is not None and exc.status < 500:
                    raise
                problems.append(str(exc))
                continue
            self.urls.remove(url)
            self.urls.insert(0, url)
            return body
        raise ApiError("; ".join(problems))

    def _call(self, url: str, method: str, path: str, params: dict[str, Any]) -> Any:
        try:
            response = self._http.request(method, url + path, params=params or None)
        except httpx.HTTPError as exc:
            raise ApiError(f"cannot reach the coordinator at {url}: {exc}") from exc
        if response.is_error:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ApiError(f"{method} {path}: HTTP {response.status_code}: {detail}", response.status_code)
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


def _stack(args: argparse.Namespace) -> StackState | None:
    """The local stack in --run-dir (or the default run dir when no --url was given), if one runs there.

    The local stack is development tooling, absent from the images: there only --run-dir asks for it.
    """
    if args.url and not args.run_dir:
        return None
    if importlib.util.find_spec("shardherd.services.local_stack") is None:
        if args.run_dir:
            raise ApiError("--run-dir needs the local stack (`shardherd up`), which this installation does not include")
        return None
    from shardherd.services.local_stack.state import StackNotRunning, StackState, run_dir

    try:
        return StackState.read(run_dir(args.run_dir))
    except StackNotRunning:
        if args.run_dir:
            raise
        return None


def _token(args: argparse.Namespace, settings: Settings, stack: StackState | None) -> str | None:
    """--token-file, else the admin token, else the stack's, else the read token (enough for `status` and `plan`)."""
    path = args.token_file or (None if settings.api_token else settings.api_token_file)
    if path is None and settings.api_token is None and stack is not None:
        path = stack.api_token_file
    if path is None and settings.api_token is None:
        path = None if settings.api_read_token else settings.api_read_token_file
        if path is None and settings.api_read_token is not None:
            return settings.api_read_token.get_secret_value()
    if path is None:
        return settings.api_token.get_secret_value() if settings.api_token is not None else None
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ApiError(f"cannot read the token file {path}: {exc.strerror}") from exc


def client_for(args: argparse.Namespace) -> OperatorClient:
    """A client of the replicas to ask, with the token to send.

    Replicas: every `--url` (repeated or comma-separated), else those of the stack in the run dir, else
    `coordinator_url`, else this host's api_port. Token: --token-file, else the configured one, else the run dir's.
    """
    settings = load_settings()
    stack = _stack(args)
    if args.url:
        urls = [url for item in args.url for url in item.split(",") if url]
    elif stack is not None:
        urls = stack.api_urls()
    else:
        urls = list(settings.coordinator_urls) or [f"http://127.0.0.1:{settings.api_port}"]
    return OperatorClient(urls, _token(args, settings, stack), args.timeout)


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def show_status(client: OperatorClient, console: Console, wide: bool = False) -> None:
    """Print the leader line, the workers table and the leases table (80 columns unless `wide`).

    Per lease: throughput, lag (millisBehindLatest), records behind (where the owner knows it exactly) and records
    processed, as the owner last reported them.
    """
    leader = client.call("GET", "/v1/leader")
    lock = leader["lock"]
    freshness = "stale" if leader["stale"] else "fresh"
    console.print(f"leader: [bold]{lock['owner'] or '-'}[/bold] epoch {lock['epoch'] or '-'}, last good run "
                  f"{_number(leader['last_success_age_seconds'])} s ago ({freshness})", highlight=False)
    console.print(f"replica: {client.url}", highlight=False)
    worker_rows = []
    for worker in client.call("GET", "/v1/workers")["items"]:
        state = worker["state"] + (" (drain)" if worker["drain_requested"] and worker["state"] != "draining" else "")
        worker_rows.append([worker["worker_id"], state, _number(worker["cpu_ema"]), str(worker["lease_count"]),
                            _number(worker["throughput_kbps"]), _number(worker["heartbeat_age_seconds"])])
    console.print(fitted("workers", ["worker", "state", "cpu %", "leases", "KiB/s", "beat s"], 2, worker_rows,
                         console.width))
    lease_rows = []
    for lease in client.leases():
        owner = lease["checkpoint_owner"] or lease["owner"] or "-"
        if lease["checkpoint_owner"]:
            owner += f" > {lease['owner']}"
        row = [lease["lease_key"], owner, lease["state"], _number(lease["throughput_kbps"]),
               _text(lease["millis_behind_latest"]), _text(lease["records_behind"]), _text(lease["records_processed"])]
        lease_rows.append(row + ([_abbreviated(lease["checkpoint"])] if wide else []))
    columns = ["shard", "owner", "state", "KiB/s", "lag ms", "behind", "records"]
    console.print(fitted("leases", columns + (["checkpoint"] if wide else []), 3, lease_rows, console.width,
                         keep_end=0))


def fitted(title: str, columns: list[str], text_columns: int, rows: list[list[str]], width: int,
           keep_end: int | None = None) -> Table:
    """A table `width` columns wide at most, one line per row.

    The first `text_columns` columns are cut short (`…`) as little as needed, the widest first; the figures after them
    keep their width. Column `keep_end` keeps its values' ends (a shard id's number) instead of their starts. Columns
    are 3 apart (the padding either side of the head's column separator).
    """
    natural = [max([len(name), *(len(row[index]) for row in rows)]) for index, name in enumerate(columns)]
    room = width - sum(natural[text_columns:]) - COLUMN_GAP * (len(columns) - 1)
    cap = max(natural[:text_columns], default=0)
    while cap > 1 and sum(min(size, cap) for size in natural[:text_columns]) > room:
        cap -= 1
    widths = [min(size, cap) for size in natural[:text_columns]] + natural[text_columns:]
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", show_edge=False, pad_edge=False)
    for index, name in enumerate(columns):
        table.add_column(name[:widths[index]], width=widths[index], no_wrap=True, overflow="ellipsis",
                         justify="left" if index < text_columns else "right")
    for row in rows:
        table.add_row(*(_cut(cell, widths[index], index == keep_end) for index, cell in enumerate(row)))
    return table


def _cut(cell: str, width: int, keep_end: bool) -> str:
    if len(cell) <= width:
        return cell
    return "…" + cell[len(cell) - width + 1:] if keep_end else cell[:max(width - 1, 0)] + "…"


def _abbreviated(checkpoint: str | None) -> str:
    """A sequence number (up to 129 digits) as its first and last digits; sentinels as they are."""
    if checkpoint is None:
        return "-"
    if len(checkpoint) <= 2 * CHECKPOINT_ENDS + 1:
        return checkpoint
    return f"{checkpoint[:CHECKPOINT_ENDS]}…{checkpoint[-CHECKPOINT_ENDS:]}"


def _text(value: int | None) -> str:
    return "-" if value is None else str(value)


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
    parser.add_argument("--url", action="append",
                        help="a coordinator replica's API base URL; repeat (or comma-separate) to fail over between "
                             "replicas (default: the replicas of the stack in the run dir, else coordinator_url, "
                             "else 127.0.0.1:api_port)")
    parser.add_argument("--run-dir", help="find the replicas and the token of the `shardherd up` stack there "
                                          "(default .shardherd/up, when a stack runs there)")
    parser.add_argument("--token-file", help="file holding the API token (default: api_token / api_token_file, "
                                             "else the run dir's token, else api_read_token / api_read_token_file; "
                                             "drain needs the admin token)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request")


def register(sub: Any) -> None:
    """Add the `status`, `drain` and `plan` subcommands."""
    status = sub.add_parser("status", help="show the leader, workers and leases (from the coordinator API)")
    _connection_args(status)
    status.add_argument("--wide", action="store_true", help="add checkpoints (abbreviated); 120 columns, not 80")
    status.set_defaults(run=lambda args: _run(args, lambda client, console: show_status(client, console, args.wide)))
    drain = sub.add_parser("drain", help="move every lease off a worker (or keep them for its restart)")
    drain.add_argument("worker", help="the worker id")
    drain.add_argument("--undo", action="store_true", help="clear the drain flag (with --restart: the reservation)")
    drain.add_argument("--restart", action="store_true",
                       help="the worker is about to restart: keep its leases reserved for it instead of moving them")
    drain.add_argument("--within", help="with --restart: how long it may be away, e.g. 90s (default 60s)")
    _connection_args(drain)
    drain.set_defaults(run=run_drain)
    plan = sub.add_parser("plan", help="show what the leader would do now (dry run, no writes)")
    _connection_args(plan)
    plan.set_defaults(run=lambda args: _run(args, show_plan))


def _run(args: argparse.Namespace, show: Callable[[OperatorClient, Console], None]) -> int:
    client = client_for(args)
    console = Console()
    console = Console(width=WIDE if getattr(args, "wide", False) else min(console.width, NARROW))
    try:
        show(client, console)
    finally:
        client.close()
    return 0


def run_drain(args: argparse.Namespace) -> int:
    """Set (or with --undo clear) the worker's drain flag, or with --restart its restart reservation."""
    if args.restart:
        return _run_restart(args)
    if args.within is not None:
        raise ApiError("--within goes with --restart (a plain drain has no window)")
    client = client_for(args)
    try:
        action = "undrain" if args.undo else "drain"
        body = client.call("POST", f"/v1/workers/{quote(args.worker, safe='')}/{action}")
    finally:
        client.close()
    state = "requested" if body["drain_requested"] else "cleared"
    print(f"drain {state} for {body['worker_id']}")
    return 0


def _run_restart(args: argparse.Namespace) -> int:
    """Reserve the worker's leases for its restart (or with --undo clear the reservation); one line."""
    path = f"/v1/workers/{quote(args.worker, safe='')}/restart"
    within = None if args.undo else parse_window(args.within or "60s")  # a bad one fails here, before any request
    client = client_for(args)
    try:
        body = (client.call("DELETE", path) if within is None
                else client.call("POST", path, within=f"{within}ms"))
    finally:
        client.close()
    if body["restart_within_ms"] is None:
        print(f"restart reservation cleared for {body['worker_id']}")
    else:
        print(f"leases of {body['worker_id']} reserved for a restart within {body['restart_within_ms'] / 1000:g} s")
    return 0
