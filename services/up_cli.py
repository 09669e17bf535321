"""`shardherd up` (the whole system on this machine) and `shardherd scenario ...` (act on the running stack)."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from sqlalchemy.engine import make_url

from shardherd.services.cli import STARTED
from shardherd.services.local_stack.control_scenarios import ControlScenarios
from shardherd.services.local_stack.pipeline import distinct_records
from shardherd.services.local_stack.poison_scenario import PoisonScenario
from shardherd.services.local_stack.processor import distinct_keys
from shardherd.services.local_stack.producer import ProducerStats
from shardherd.services.local_stack.scenarios import Outcome, Scenarios
from shardherd.services.local_stack.stack import PIPELINE_DIR, PLAIN_RECORDS_DIR, LocalStack, StackFailed, StackOptions
from shardherd.services.local_stack.state import READ_TOKEN_FILE, StackState, run_dir
from shardherd.services.local_stack.status import StartupTimes, StatusPrinter, memory_line
from shardherd.services.local_stack.supervisor import log_tail
from shardherd.shared.config import Settings, load_settings
from shardherd.shared.errors import ConfigError
from shardherd.shared.store_factory import open_store

Say = Callable[[str], None]


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
    up.add_argument("--key-skew", type=float, default=1.2,
                    help="Zipf exponent of the producer's partition keys (default 1.2: hot and nearly idle shards; "
                         "0: no hot keys, every shard within a few times the mean rate)")
    mode = up.add_mutually_exclusive_group()
    mode.add_argument("--no-spark", dest="spark", action="store_false",
                      help="plain agents with a counting processor, for a quick look")
    mode.add_argument("--spark", dest="spark", action="store_true",
                      help="each agent is a local Spark driver running the example pipeline (the default)")
    up.set_defaults(spark=True)
    up.add_argument("--poison-policy", choices=("block", "quarantine"), default=None,
                    help="plain agents' poison_policy (decision 0031); quarantine writes poison records under "
                         "RUN_DIR/dead-letters unless poison_destination is configured (default: as configured)")
    up.add_argument("--spark-master", default="local[1]", help="Spark master of each agent's driver")
    up.add_argument("--spark-driver-memory", default="512m", help="driver JVM heap of each Spark agent")
    up.add_argument("--aws", action="store_true",
                    help="start no emulators: real AWS through the standard boto3 credential chain")
    up.add_argument("--create-stream", action="store_true", help="create the stream on real AWS if it is missing")
    up.add_argument("--aws-limits", action=argparse.BooleanOptionalAction, default=True,
                    help="put the Kinesis limits proxy (AWS's per-shard limits and throttling errors) in front of the "
                         "stack's kinesalite (default on; decision 0029)")
    up.add_argument("--api-port", type=int, default=None,
                    help="coordinator-N serves its API on this port + N - 1 (default: SHARDHERD_API_PORT if set, "
                         "else free ports)")
    up.add_argument("--duration", type=float, default=None,
                    help="stop by itself this many seconds after the command started")
    up.add_argument("--startup-timeout", type=float, default=180.0,
                    help="fail if every shard is not owned and checkpointed this many seconds after start-up")
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
    leader = actions.add_parser("kill-leader", help="SIGKILL the leading coordinator replica")
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
    pause = actions.add_parser("pause", help="pause a shard, kill the leader and its owner, resume; count records")
    pause.add_argument("shard", nargs="?", help="lease key (default: the first)")
    pause.add_argument("--no-chaos", dest="chaos", action="store_false", help="do not kill the leader and owner")
    poison = actions.add_parser("poison", help="put a record the plain agents' processor rejects into a shard; "
                                               "follow its bisection, block or quarantine; count records")
    poison.add_argument("shard", nargs="?", help="lease key (default: the busiest)")
    rewind = actions.add_parser("rewind", help="rewind shards a little while back; time and count redeliveries")
    rewind.add_argument("--ago", type=float, default=30.0, help="seconds back from now (default 30)")
    rewind.add_argument("--shards", nargs="+", default=[], help="only these shards (default: all)")
    # After the name too, as for status.
    for action in (add, kill, leader, drain, split, merge, hot, pause, rewind, poison):
        action.add_argument("--run-dir", default=argparse.SUPPRESS, help="the stack's run directory")
        action.add_argument("--timeout", type=float, default=argparse.SUPPRESS, help="seconds to wait for the effect")
    scenario.set_defaults(run=run_scenario)


def run_up(args: argparse.Namespace) -> int:
    """Start the stack, print the dashboard URLs and a live status, stop cleanly on Ctrl-C/SIGTERM or --duration.

    `--duration` counts from the command's start. Start-up (every shard owned, a first checkpoint) must complete
    within `--startup-timeout` s, else `up` stops everything and fails saying what it was waiting for; so does a child
    that exits during start-up.
    """
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = STARTED  # the command's own start, imports included (not the process's: see services/cli.py)
    if args.spark:
        _require_spark()
    settings = load_settings()
    for name in ("duration", "startup_timeout"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive (got {value})")
    directory = run_dir(args.run_dir)
    options = StackOptions(run_dir=directory, shards=args.shards, agents=args.agents, coordinators=args.coordinators,
                           rate=args.rate, aggregated_fraction=args.aggregated, seed=args.seed,
                           zipf_exponent=args.key_skew,
                           use_aws=args.aws, create_stream=args.create_stream, api_port=_api_port(args, settings),
                           aws_limits=args.aws_limits,
                           spark=args.spark, spark_master=args.spark_master,
                           spark_driver_memory=args.spark_driver_memory, poison_policy=args.poison_policy,
                           api_timeout=args.startup_timeout)
    stopping = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    console = Console()

    def say(text: str) -> None:
        console.print(text, highlight=False, soft_wrap=True)

    deadline = None if args.duration is None else started + args.duration
    stack = LocalStack(options, settings)
    stack.start()
    try:
        printer = _report_start(stack, say, console, args, started, stopping, deadline)
        while not stopping.wait(0.2):
            if deadline is not None and time.time() >= deadline:
                break
        printer.stop()
    finally:
        say("stopping: coordinators, then agents (checkpoint, give leases back), then emulators ...")
        began = time.monotonic()
        stack.stop()
        say(f"stopped in {time.monotonic() - began:.1f} s")
    _report_records(stack, say, directory, printer.outside)
    return 0


def _api_port(args: argparse.Namespace, settings: Settings) -> int:
    """--api-port, else a configured SHARDHERD_API_PORT, else 0: free ports (8080 may belong to someone else)."""
    if args.api_port is not None:
        return int(args.api_port)
    return settings.api_port if "api_port" in settings.model_fields_set else 0


def _say_where(stack: LocalStack, say: Say) -> None:
    """What runs where: the stream, the processes, the store, Kinesis, the dashboard and the run directory."""
    options, state = stack.options, stack.state()
    kind = "Spark agents (example pipeline)" if options.spark else "plain agents"
    holds = (f"DynamoDB {state.dynamodb_endpoint_url or 'AWS'}" if stack.settings.store_backend == "dynamodb"
             else f"SQL store {make_url(stack.settings.sql_url.get_secret_value()).render_as_string()}")
    say(f"shardherd up: stream {state.stream_name} ({options.shards} shards), "
        f"{options.coordinators} coordinators, {options.agents} {kind}"
        f"; {holds}, Kinesis {state.kinesis_endpoint_url or 'AWS'}")
    say(f"dashboard: {'  '.join(url + '/' + dashboard_fragment(options.run_dir) for url in state.api_urls())}"
        "   (every replica serves it)")
    say(f"run dir: {options.run_dir}   (Ctrl-C stops everything)")
    say(f"try: {follow_up_command()} scenario --run-dir {options.run_dir} kill-agent")


def _report_start(stack: LocalStack, say: Say, console: Console, args: argparse.Namespace, started: float,
                  stopping: threading.Event, deadline: float | None) -> StatusPrinter:
    """Print where everything is, start the live status, and wait (bounded) for start-up to complete."""
    options = stack.options
    _say_where(stack, say)
    printer = StatusPrinter(stack, console, args.interval, started).start()
    if options.agents == 0:
        say(f"no agents: the {options.shards} shards stay unassigned until `scenario add-agent`")
        return printer
    startup = StartupTimes()
    store = open_store(stack.child_settings())
    watcher = threading.Thread(target=startup.watch, args=(store, options.shards, started), daemon=True)
    watcher.start()
    limit = time.monotonic() + args.startup_timeout
    try:
        while not startup.done.wait(0.2):
            crashed = stack.crashed()
            if crashed:
                child = crashed[0]
                raise StackFailed(f"{child.name} exited during start-up (code {child.process.returncode}); its log "
                                  f"{child.log_path} ends with:\n{log_tail(child.log_path).rstrip()}")
            if stopping.is_set() or (deadline is not None and time.time() >= deadline):
                say(f"start-up not complete when stopped: it was waiting for {startup.waiting_for(options.shards)}")
                return printer
            if time.monotonic() >= limit:
                raise StackFailed(f"start-up did not complete within {args.startup_timeout:g} s: waiting for "
                                  f"{startup.waiting_for(options.shards)}; logs in {options.run_dir / 'logs'}")
    except BaseException:
        printer.stop()
        raise
    finally:
        startup.cancelled.set()
        watcher.join(5)
        store.close()
    say(f"startup: first lease assigned after {_seconds(startup.first_assignment)}, all {options.shards} "
        f"shards after {_seconds(startup.all_assigned)}, first records checkpointed after "
        f"{_seconds(startup.first_checkpoint)} (from the command's start); memory {memory_line(stack)}")
    if options.spark and startup.first_checkpoint is not None:
        say(f"first records written as Parquet under {options.pipeline_dir / 'records'} (one directory per agent)")
    return printer


def _report_records(stack: LocalStack, say: Say, directory: Path, outside: set[str]) -> None:
    """Produced against processed (distinct records per shard, from the agents' durable output).

    Records not in the agents' output were read by none of them: still in the stream, unless workers outside the
    stack (`outside`: a job of the user's, `examples.shard_counts`) held leases, which then read some of them.
    """
    options, producer = stack.options, stack.producer
    produced = producer.stats if producer else ProducerStats()
    if options.spark:
        processed = distinct_records(options.pipeline_dir / "records")
        where = f"in Parquet under {options.pipeline_dir / 'records'}"
    else:
        processed = distinct_keys(options.plain_records_dir)
        where = f"(record keys under {options.plain_records_dir})"
    say(f"produced {produced.user_records} records ({produced.aggregated_user_records} in KPL aggregates); "
        f"processed {sum(processed.values())} distinct records over {len(processed)} shards {where}")
    behind = {shard: count - processed.get(shard, 0) for shard, count in sorted(produced.by_shard.items())
              if count != processed.get(shard, 0)}
    if behind:
        where = (f"read by {', '.join(sorted(outside))} (workers outside the stack) or still in the stream"
                 if outside else "still in the stream")
        say(f"not in the agents' output ({where}): " + ", ".join(f"{shard} {count}" for shard, count in behind.items()))
    if options.spark:
        say(f"per-shard counts and bytes: {sys.executable} -m examples.shard_counts --counts --run-dir {directory}")


def dashboard_fragment(directory: Path) -> str:
    """The dashboard address's `#token=<the stack's read token>` (empty without one): the page then sends it.

    Its figures are then at most `api_cache_millis` old; an anonymous page gets the leader's view, up to a full-scan
    interval old.
    """
    token = directory / READ_TOKEN_FILE
    return f"#token={token.read_text(encoding='utf-8').strip()}" if token.is_file() else ""


def follow_up_command() -> str:
    """How to run `shardherd` again from this shell: its name if PATH finds this one, else its path."""
    invoked = Path(sys.argv[0])
    if invoked.name == "shardherd":
        found = shutil.which("shardherd")
        if found is not None and Path(found).resolve() == invoked.resolve():
            return "shardherd"
        return str(invoked)
    return f"{sys.executable} -m shardherd"


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
    elif args.action in ("pause", "rewind", "poison"):
        directory = run_dir(args.run_dir)
        pipeline = directory / PIPELINE_DIR / "records"  # a Spark stack's output, else the plain agents'
        controls = ControlScenarios(scenarios, pipeline if pipeline.is_dir() else directory / PLAIN_RECORDS_DIR)
        if args.action == "poison":
            outcomes = PoisonScenario(controls).run(args.shard)
        else:
            outcomes = (controls.pause(args.shard, args.chaos) if args.action == "pause"
                        else controls.rewind(args.ago, args.shards))
    else:
        outcomes = scenarios.hot_shard(args.shard, args.rate, args.watch)
    print(f"done in {time.monotonic() - started:.1f} s")
    return 1 if any(outcome.seconds is None for outcome in outcomes) else 0
