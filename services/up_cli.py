"""`shardherd up` (the whole system on this machine) and `shardherd scenario ...` (act on the running stack)."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
import signal
import threading
import time
from types import FrameType
from typing import Any

import psutil
from rich.console import Console

from services.local_stack.pipeline import distinct_records
from services.local_stack.scenarios import Outcome, Scenarios
from services.local_stack.stack import PIPELINE_DIR, LocalStack, StackOptions
from services.local_stack.state import StackState, run_dir
from services.local_stack.status import StartupTimes, StatusPrinter, tree_memory
from shared.config import load_settings
from shared.errors import ConfigError
from shared.store_factory import open_store


class SparkUnavailable(ConfigError):
    """Spark agents were asked for (the default) but pyspark, pyarrow or Java is missing."""


def register(sub: Any) -> None:
    """Add the `up` and `scenario` subcommands."""
    up = sub.add_parser("up", help="run the whole system locally: emulators, producer, coordinators, agents, API")
    up.add_argument("--shards", type=int, default=8, help="shards of a newly created stream (default 8)")
    up.add_argument("--agents", type=int, default=3, help="agents to start (default 3)")
    up.add_argument("--coordinators", type=int, default=2, help="coordinator replicas (default 2)")
    up.add_argument("--rate", type=float, default=200.0, help="user records per second the producer puts")
    up.add_argument("--aggregated", type=float, default=0.3, help="fraction of records packed KPL-style")
    up.add_argument("--seed", type=int, default=7, help="seed of the producer's key choice")
    mode = up.add_mutually_exclusive_group()
    mode.add_argument("--no-spark", dest="spark", action="store_false",
                      help="plain agents with a counting processor, for a quick look")
    mode.add_argument("--spark", dest="spark", action="store_true",
                      help="each agent is a local Spark driver running the example pipeline (the default)")
    up.set_defaults(spark=True)
    up.add_argument("--spark-master", default="local[1]", help="Spark master of each agent's driver")
    up.add_argument("--spark-driver-memory", default="512m", help="driver JVM heap of each Spark agent")
    up.add_argument("--aws", action="store_true",
                    help="start no emulators: real AWS through the standard boto3 credential chain")
    up.add_argument("--create-stream", action="store_true", help="create the stream on real AWS if it is missing")
    up.add_argument("--api-port", type=int, default=None,
                    help="coordinator-N serves its API on this port + N - 1 (default: api_port, 8080; 0: free ports)")
    up.add_argument("--duration", type=float, default=None, help="stop by itself after this many seconds")
    up.add_argument("--interval", type=float, default=2.0, help="status refresh period in seconds")
    up.add_argument("--run-dir", help="state file, control socket and logs (default .shardherd/up)")
    up.set_defaults(run=run_up)

    scenario = sub.add_parser("scenario", help="act on the stack `shardherd up` runs, and time the effect")
    scenario.add_argument("--run-dir", help="the stack's run directory (default .shardherd/up)")
    scenario.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for the effect")
    actions = scenario.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add-agent", help="start one more agent")
    add.add_argument("--watch", type=float, default=30.0, help="seconds to watch for leases moving to it")
    kill = actions.add_parser("kill-agent", help="SIGKILL an agent (default: the one with most leases)")
    kill.add_argument("name", nargs="?")
    actions.add_parser("kill-leader", help="SIGKILL the leading coordinator replica")
    drain = actions.add_parser("drain", help="ask the leader to move every lease off a worker")
    drain.add_argument("worker")
    split = actions.add_parser("split", help="split a shard in the middle of its hash range")
    split.add_argument("shard")
    merge = actions.add_parser("merge", help="merge two adjacent shards")
    merge.add_argument("first")
    merge.add_argument("second")
    hot = actions.add_parser("hot-shard", help="send extra records to one shard and watch the leader react")
    hot.add_argument("shard")
    hot.add_argument("--rate", type=float, default=1000.0, help="extra records per second (0 ends it)")
    hot.add_argument("--watch", type=float, default=30.0, help="seconds to watch for moves")
    scenario.set_defaults(run=run_scenario)


def run_up(args: argparse.Namespace) -> int:
    """Start the stack, print the dashboard URL and a live status, stop cleanly on Ctrl-C/SIGTERM or --duration."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.spark:
        _require_spark()
    started = psutil.Process().create_time()
    settings = load_settings()
    if args.duration is not None and args.duration <= 0:
        raise ConfigError(f"--duration must be positive (got {args.duration})")
    directory = run_dir(args.run_dir)
    options = StackOptions(run_dir=directory, shards=args.shards, agents=args.agents, coordinators=args.coordinators,
                           rate=args.rate, aggregated_fraction=args.aggregated, seed=args.seed,
                           use_aws=args.aws, create_stream=args.create_stream,
                           api_port=settings.api_port if args.api_port is None else args.api_port,
                           spark=args.spark, spark_master=args.spark_master,
                           spark_driver_memory=args.spark_driver_memory)
    stopping = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    console = Console()

    def say(text: str) -> None:
        console.print(text, highlight=False, soft_wrap=True)

    stack = LocalStack(options, settings)
    stack.start()
    state = stack.state()
    kind = "Spark agents (example pipeline)" if options.spark else "plain agents"
    say(f"shardherd up: stream {state.stream_name} ({options.shards} shards), "
        f"{options.coordinators} coordinators, {options.agents} {kind}"
        f"; DynamoDB {state.dynamodb_endpoint_url or 'AWS'}, Kinesis {state.kinesis_endpoint_url or 'AWS'}")
    say(f"dashboard: {state.dashboard_url}   run dir: {directory}   (Ctrl-C stops everything)")
    say(f"try: shardherd scenario --run-dir {directory} kill-agent")
    startup = StartupTimes()
    store = open_store(stack.child_settings())
    threading.Thread(target=startup.watch, args=(store, options.shards, started), daemon=True).start()
    printer = StatusPrinter(stack, console, args.interval, started).start()
    while not startup.done.wait(0.2) and not stopping.is_set():
        pass
    memory, count = tree_memory(os.getpid())
    say(f"startup: first lease assigned after {_seconds(startup.first_assignment)}, all {options.shards} "
        f"shards after {_seconds(startup.all_assigned)}, first records checkpointed after "
        f"{_seconds(startup.first_checkpoint)} (from process start); memory "
        f"{memory / 2**20:.0f} MiB in {count} processes")
    if options.spark and startup.first_checkpoint is not None:
        say(f"first records written as Parquet under {directory / PIPELINE_DIR / 'records'} (one directory per agent)")
    deadline = None if args.duration is None else started + args.duration
    while not stopping.wait(0.2):
        if deadline is not None and time.time() >= deadline:
            break
    printer.stop()
    say("stopping: agents drain, then coordinators, then emulators ...")
    began = time.monotonic()
    store.close()
    stack.stop()
    produced = stack.producer.stats if stack.producer else None
    say(f"stopped in {time.monotonic() - began:.1f} s; produced "
        f"{produced.user_records if produced else 0} records "
        f"({produced.aggregated_user_records if produced else 0} in KPL aggregates)")
    if options.spark:
        counted = distinct_records(options.pipeline_dir / "records")
        say(f"pipeline: {sum(counted.values())} distinct records over {len(counted)} shards in Parquet under "
            f"{options.pipeline_dir / 'records'} (per-shard counts: python -m examples.shard_counts --counts "
            f"--run-dir {directory})")
    return 0


def _require_spark() -> None:
    """Spark agents need pyspark, pyarrow and Java: say so up front instead of in every agent's log."""
    missing = [name for name in ("pyspark", "pyarrow") if importlib.util.find_spec(name) is None]
    if missing:
        raise SparkUnavailable(f"Spark agents need {' and '.join(missing)} (pip install 'shardherd[spark]'); "
                               "or run `shardherd up --no-spark`")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise SparkUnavailable("Spark agents need Java 17 or 21 on PATH (or JAVA_HOME); "
                               "or run `shardherd up --no-spark`")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def run_scenario(args: argparse.Namespace) -> int:
    """Run one scenario against the stack in the run directory; exit 1 if an effect was not seen in time."""
    state = StackState.read(run_dir(args.run_dir))
    scenarios = Scenarios(state, args.timeout)
    started = time.monotonic()
    outcomes: list[Outcome]
    if args.action == "add-agent":
        outcomes = scenarios.add_agent(args.watch)
    elif args.action == "kill-agent":
        outcomes = scenarios.kill_agent(args.name)
    elif args.action == "kill-leader":
        outcomes = scenarios.kill_leader()
    elif args.action == "drain":
        outcomes = scenarios.drain(args.worker)
    elif args.action == "split":
        outcomes = scenarios.split(args.shard)
    elif args.action == "merge":
        outcomes = scenarios.merge(args.first, args.second)
    else:
        outcomes = scenarios.hot_shard(args.shard, args.rate, args.watch)
    print(f"done in {time.monotonic() - started:.1f} s")
    return 1 if any(outcome.seconds is None for outcome in outcomes) else 0
