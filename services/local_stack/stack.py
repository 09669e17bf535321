"""The local stack: emulators, stream and tables, coordinator replicas, agents, producer, control socket, state file.

Agents are local Spark drivers running the example pipeline (`shardherd.services.local_stack.spark_agent`, Parquet under
`<run dir>/shard-counts`) unless `spark=False`, which runs plain agents with a counting processor.

Stop order on Ctrl-C/SIGTERM: the producer, then the coordinators (leadership released, so no leader reassigns
leases while agents stop), then all agents (checkpoints written, leases given back at once: there is nobody to drain
to), then the emulators. Every child also stops itself if this process dies.

With the state file the stack writes `<run dir>/job.env`: the variables a job of the user's needs to join the stack
as one more worker (application, stream, region, endpoints, coordinator URLs, the stack's timings, dummy AWS keys for
the emulators), one `NAME=value` line each, shell-quoted (`set -a; . job.env; set +a`).
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import shlex
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from botocore.exceptions import BotoCoreError, ClientError

from shardherd.services.emulators.ports import LOOPBACK, free_port, wait_until
from shardherd.services.local_stack.control import ControlServer
from shardherd.services.local_stack.emulators import Emulators, Endpoints, local_shard_limit
from shardherd.services.local_stack.processor import RECORDS_DIR_ENV
from shardherd.services.local_stack.producer import Producer, ZipfKeys
from shardherd.services.local_stack.restarts import Restarts
from shardherd.services.local_stack.state import (
    CONTROL_SOCKET,
    JOB_ENV_FILE,
    LOG_DIR,
    READ_TOKEN_FILE,
    STATE_FILE,
    TOKEN_FILE,
    ProcessEntry,
    RunDirLock,
    StackState,
    rotate,
)
from shardherd.services.local_stack.supervisor import Child, Supervisor, log_tail
from shardherd.shared.aws import make_client
from shardherd.shared.config import Settings, load_settings
from shardherd.shared.errors import ConfigError, ShardherdError
from shardherd.shared.store_factory import open_store

log = logging.getLogger(__name__)

AGENT, COORDINATOR = "agent", "coordinator"
PLAIN_PROCESSOR = "shardherd.services.local_stack.processor:CountingProcessor"
SPARK_AGENT = "shardherd.services.local_stack.spark_agent"
PIPELINE_DIR = "shard-counts"
PLAIN_RECORDS_DIR = "plain-records"
DEAD_LETTER_DIR = "dead-letters"  # `up --poison-policy quarantine`: the agents' poison destination (decision 0031)
# SIGTERM makes an agent drain: the leader hands its leases to the others first (one agent leaving a running fleet).
# When the whole stack stops there is nobody to hand them to: SIGUSR1 has it checkpoint and give them back at once.
FLEET_STOP = signal.SIGUSR1
DEFAULT_STREAM = "shardherd-local"
STREAM_TIMEOUT = 60.0
# Faster than the production defaults so a first look assigns within seconds; any value the user configured wins.
# CPU metrics stay on, as users run them: agents sharing this host measure their own process trees
# (agent/metrics/cpu_tree.py), not the host's load.
# Demo intervals; the dashboard's lease progress is as fresh as the leader's last full scan (decision 0010), so the
# demo scans every 5 s where a deployment scans every 20 s.
LOCAL_DEFAULTS = {"discovery_interval_millis": 500, "lease_assignment_interval_millis": 1000,
                  "leader_full_scan_interval_millis": 5000}


class StackFailed(ShardherdError, RuntimeError):
    """A part of the stack did not start."""


MAX_KEY_SKEW = 10.0  # beyond it nearly every record has the first key: one hot shard, the rest idle


@dataclass(frozen=True)
class StackOptions:
    """What `shardherd up` was asked for."""

    run_dir: Path
    shards: int = 8
    agents: int = 3
    coordinators: int = 2
    rate: float = 200.0
    aggregated_fraction: float = 0.3
    keys: int = 1000
    zipf_exponent: float = 1.2
    seed: int = 7
    use_aws: bool = False
    create_stream: bool = False
    aws_limits: bool = True  # the limits proxy in front of the stack's own kinesalite (decision 0029)
    api_port: int = 8080  # coordinator-N serves on api_port + N - 1; 0 picks free ports
    drain_timeout: float = 5.0  # per agent on stop, before it gives its leases back itself
    stop_grace: float = 30.0
    spark: bool = True  # agents embedded in local Spark drivers running the example pipeline
    spark_master: str = "local[1]"
    spark_driver_memory: str = "512m"
    poison_policy: str | None = None  # block or quarantine (into DEAD_LETTER_DIR); None: the configured policy
    # How long a coordinator's API may take to listen: tens of agents importing at once on two cores delay it.
    api_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.poison_policy not in (None, "block", "quarantine"):
            raise ConfigError(f"--poison-policy is block or quarantine (got {self.poison_policy!r})")
        if self.spark and self.poison_policy is not None:
            raise ConfigError("--poison-policy needs plain agents (--no-spark): Spark agents do not bisect batches "
                              "or quarantine records (docs/spark.md)")
        if not 0 <= self.zipf_exponent <= MAX_KEY_SKEW:
            raise ConfigError(f"--key-skew is between 0 (every shard alike) and {MAX_KEY_SKEW:g} "
                              f"(got {self.zipf_exponent:g})")

    @property
    def pipeline_dir(self) -> Path:
        """Where Spark agents write the example pipeline's Parquet, checkpoints and channels."""
        return self.run_dir / PIPELINE_DIR

    @property
    def plain_records_dir(self) -> Path:
        """Where plain agents keep the keys of the records they processed (see processor.py beside this file)."""
        return self.run_dir / PLAIN_RECORDS_DIR

    @property
    def dead_letter_dir(self) -> Path:
        """Where plain agents quarantine poison records under `--poison-policy quarantine`."""
        return self.run_dir / DEAD_LETTER_DIR


class LocalStack:
    """Starts and stops everything; serves the control socket scenario commands use."""

    def __init__(self, options: StackOptions, settings: Settings) -> None:
        if options.shards < 1 or options.agents < 0 or options.coordinators < 1:
            raise ConfigError("need at least one shard and one coordinator, and a non-negative agent count")
        self.options = options
        self.settings = settings
        self.stream = settings.stream_name or DEFAULT_STREAM
        self.supervisor = Supervisor(options.run_dir / LOG_DIR)
        self.restarts = Restarts(self.supervisor, (AGENT, COORDINATOR))
        self._lock = RunDirLock(options.run_dir)
        self._owner = False
        self.emulators = Emulators(settings, self.supervisor, options.use_aws, options.aws_limits,
                                   shard_limit=local_shard_limit(options.shards))
        self.endpoints = Endpoints(settings.dynamodb_endpoint_url, settings.kinesis_endpoint_url)
        self.producer: Producer | None = None
        self.control: ControlServer | None = None
        self._env: dict[str, str] = {}
        self._serial = {AGENT: 0, COORDINATOR: 0}
        self._guard = threading.RLock()

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        """Own the run directory, bring everything up; on failure, stop what was started and raise.

        RunDirInUse if another `shardherd up` owns the directory: nothing of its stack is touched.
        """
        self._lock.acquire()
        self._owner = True
        for directory in (self.options.run_dir / LOG_DIR, self.options.pipeline_dir, self.options.plain_records_dir,
                          self.options.dead_letter_dir):
            rotate(directory)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.endpoints = self.emulators.start()
        self._env = self._child_env()
        kinesis = make_client("kinesis", self.settings.region, self.endpoints.kinesis)
        self._ensure_stream(kinesis)
        store = open_store(self.child_settings())
        try:
            store.ensure_tables()
        finally:
            store.close()
        for _ in range(self.options.coordinators):
            self.add_coordinator()
        for _ in range(self.options.agents):
            self.add_agent()
        rng = random.Random(self.options.seed)
        keys = ZipfKeys(self.options.keys, self.options.zipf_exponent, rng)
        self.producer = Producer(kinesis, self.stream, self.options.rate, self.options.aggregated_fraction, keys,
                                 rng).start()
        self.control = ControlServer(self.options.run_dir / CONTROL_SOCKET, self.handle).start()
        self.write_state()
        for coordinator in self.supervisor.children(COORDINATOR):
            _wait_for_api(coordinator, self.options.api_timeout)

    def _poison_env(self) -> dict[str, str]:
        """`--poison-policy`: the agents' policy; under quarantine the run's dead letters unless one is configured."""
        policy = self.options.poison_policy
        if policy is None:
            return {}
        env = {"SHARDHERD_POISON_POLICY": policy}
        if policy == "quarantine" and self.settings.poison_destination is None:
            env["SHARDHERD_POISON_DESTINATION"] = self.options.dead_letter_dir.as_uri()
        return env

    def poison(self) -> tuple[str, str | None]:
        """The agents' poison policy and destination (what `scenario poison` expects)."""
        policy = self._env.get("SHARDHERD_POISON_POLICY", self.settings.poison_policy)
        destination = self._env.get("SHARDHERD_POISON_DESTINATION", self.settings.poison_destination)
        return policy, destination if policy == "quarantine" else None

    def crashed(self) -> list[Child]:
        """Children that exited without being asked to (not marked as reported: the status printer does that)."""
        return [child for child in self.supervisor.children(alive_only=False)
                if not child.alive and not child.expected_exit]

    def _child_env(self) -> dict[str, str]:
        env = {**os.environ, "SHARDHERD_STREAM_NAME": self.stream,
               "SHARDHERD_APPLICATION_NAME": self.settings.application_name}
        configured = self.settings.model_fields_set
        if not {"api_token", "api_token_file"} & configured:
            env["SHARDHERD_API_TOKEN_FILE"] = str(self._token_file(TOKEN_FILE))
        if not {"api_read_token", "api_read_token_file"} & configured:  # what the agents send (decision 0021)
            env["SHARDHERD_API_READ_TOKEN_FILE"] = str(self._token_file(READ_TOKEN_FILE))
        for name, value in LOCAL_DEFAULTS.items():
            if name not in self.settings.model_fields_set:
                env[f"SHARDHERD_{name.upper()}"] = str(value)
        if self.endpoints.dynamodb is not None:
            env["SHARDHERD_DYNAMODB_ENDPOINT_URL"] = self.endpoints.dynamodb
        if self.endpoints.kinesis is not None:
            env["SHARDHERD_KINESIS_ENDPOINT_URL"] = self.endpoints.kinesis
        env[RECORDS_DIR_ENV] = str(self.options.plain_records_dir)
        env.update(self._poison_env())
        if self.emulators.moto is not None or self.emulators.kinesalite is not None:
            env.setdefault("AWS_ACCESS_KEY_ID", "local")
            env.setdefault("AWS_SECRET_ACCESS_KEY", "local")
        return env

    def _token_file(self, name: str) -> Path:
        """A fresh random API token (admin: scenarios may drain workers; read: the agents'), for this user only."""
        path = self.options.run_dir / name
        path.unlink(missing_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as token:
            token.write(secrets.token_urlsafe(24))
        return path

    def child_settings(self) -> Settings:
        """The settings every child sees (the parent's plus the stream and emulator endpoints)."""
        return load_settings(stream_name=self.stream, dynamodb_endpoint_url=self.endpoints.dynamodb,
                             kinesis_endpoint_url=self.endpoints.kinesis)

    def _ensure_stream(self, kinesis: Any) -> None:
        """Create the stream when missing (always on emulators; with --create-stream on real AWS), wait ACTIVE.

        Errors of Kinesis (or its emulator) become one StackFailed line naming the call, the code and the reason.
        """
        endpoint = self.endpoints.kinesis
        where = f"Kinesis at {endpoint}" if endpoint else f"Kinesis ({self.settings.region})"
        try:
            self._create_stream(kinesis)
            wait_until(lambda: kinesis.describe_stream_summary(StreamName=self.stream)["StreamDescriptionSummary"][
                "StreamStatus"] in ("ACTIVE", "UPDATING"), STREAM_TIMEOUT, f"stream {self.stream}", lambda: True)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise StackFailed(f"{where} refused {exc.operation_name} of stream {self.stream} "
                              f"({self.options.shards} shards): {error.get('Code')}: {error.get('Message')}") from None
        except BotoCoreError as exc:
            raise StackFailed(f"{where}: {exc}") from None

    def _create_stream(self, kinesis: Any) -> None:
        try:
            kinesis.describe_stream_summary(StreamName=self.stream)
        except kinesis.exceptions.ResourceNotFoundException as exc:
            if self.emulators.kinesalite is None and not self.options.create_stream:
                raise StackFailed(f"stream {self.stream} does not exist; create it or pass --create-stream") from exc
            kinesis.create_stream(StreamName=self.stream, ShardCount=self.options.shards)

    def _next_name(self, role: str) -> str:
        self._serial[role] += 1
        return f"{role}-{self._serial[role]}"

    def add_coordinator(self) -> Child:
        """Start one more coordinator replica with its operator API."""
        with self._guard:
            name = self._next_name(COORDINATOR)
            port = self._api_port(self._serial[COORDINATOR])
            env = {**self._env, "SHARDHERD_WORKER_ID": name, "SHARDHERD_API_PORT": str(port),
                   "SHARDHERD_API_HOST": LOOPBACK}
            child = self.supervisor.spawn(name, COORDINATOR, "shardherd", ["coordinator"], env, grace=10.0,
                                          port=port, api_url=f"http://{LOOPBACK}:{port}")
        return child

    def _api_port(self, index: int) -> int:
        if self.options.api_port == 0:
            return free_port()
        return self.options.api_port + index - 1

    def add_agent(self, spark: bool | None = None) -> Child:
        """Start one more agent: a Spark driver running the example pipeline, or a plain agent.

        `spark` chooses; by default the stack's mode. A plain stack may take Spark agents too (a scale run's mixed
        fleet, bench/scale.py).
        """
        options = self.options
        spark = options.spark if spark is None else spark
        drain = str(options.drain_timeout)
        with self._guard:
            name = self._next_name(AGENT)
            env = {**self._env, "SHARDHERD_WORKER_ID": name}
            if "coordinator_url" not in self.settings.model_fields_set:
                # Every replica started so far: the agent learns of assignment changes from whichever leads
                # (decision 0008), and tells it of its own (decision 0010), instead of polling the store.
                env["SHARDHERD_COORDINATOR_URL"] = ",".join(
                    child.api_url for child in self.supervisor.children(COORDINATOR) if child.api_url)
            if spark:
                args = ["--out", str(options.pipeline_dir), "--master", options.spark_master,
                        "--driver-memory", options.spark_driver_memory, "--drain-timeout", drain]
                # Draining waits for in-flight batches; then the query and the JVM stop.
                child = self.supervisor.spawn(name, AGENT, SPARK_AGENT, args, env, grace=options.drain_timeout + 30)
            else:
                args = ["agent", "--processor", PLAIN_PROCESSOR, "--drain-timeout", drain]
                child = self.supervisor.spawn(name, AGENT, "shardherd", args, env, grace=options.drain_timeout + 10)
        self.write_state()
        return child

    # ------------------------------------------------------------------ control
    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """Carry out one control request (see shardherd.services.local_stack.control)."""
        op = request["op"]
        if op == "add-agent":
            spark = request.get("spark")
            if spark is not None and not isinstance(spark, bool):
                raise StackFailed(f"add-agent: spark must be true or false, not {spark!r}")
            return {"name": self.add_agent(spark).name}
        if op == "kill":
            sig = signal.Signals[str(request.get("signal", "SIGKILL"))]
            child = self.supervisor.kill(str(request["name"]), sig)
            child.process.wait(child.launch.grace + 45)  # SIGTERM drains first: 37 s for one agent at load 40
            self.write_state()
            return {"name": child.name, "pid": child.pid, "signal": sig.name}
        if op == "restart":  # a pod restarted in place (a StatefulSet's): SIGTERM, then the same name started again
            child = self.supervisor.kill(str(request["name"]), signal.SIGTERM)
            child.process.wait(child.launch.grace + 45)  # its checkpoints first, on a loaded host
            again = self.supervisor.respawn(child)
            self.write_state()
            return {"name": again.name, "pid": again.pid, "exit": child.process.returncode}
        if op == "hot-shard":
            if self.producer is None:
                raise StackFailed("the producer is not running")
            self.producer.make_hot(str(request["shard"]), float(request["rate"]))
            return {"shard": request["shard"], "rate": float(request["rate"])}
        raise ValueError(f"unknown control operation {op!r}")

    def state(self) -> StackState:
        """The current state file contents."""
        coordinators = self.supervisor.children(COORDINATOR)
        dashboard = coordinators[0].api_url if coordinators else ""
        processes = [ProcessEntry(child.name, child.role, child.pid, child.api_url, child.port)
                     for child in self.supervisor.children() if child.role in (AGENT, COORDINATOR)]
        policy, destination = self.poison()
        return StackState(os.getpid(), self.settings.application_name, self.stream, self.settings.region,
                          self.endpoints.kinesis, self.endpoints.dynamodb, f"{dashboard}/",
                          str(self.options.run_dir / CONTROL_SOCKET), self._env.get("SHARDHERD_API_TOKEN_FILE"),
                          [*self.emulators.entries(), *processes], spark=self.options.spark, poison_policy=policy,
                          poison_destination=destination)

    def write_state(self) -> None:
        """Rewrite the state file and the job environment."""
        with self._guard:
            self.state().write(self.options.run_dir)
            temporary = self.options.run_dir / (JOB_ENV_FILE + ".tmp")
            temporary.write_text("".join(f"{name}={shlex.quote(value)}\n"
                                         for name, value in sorted(self.job_env().items())), encoding="utf-8")
            temporary.replace(self.options.run_dir / JOB_ENV_FILE)

    def job_env(self) -> dict[str, str]:
        """What a job needs to join the stack as a worker: the agents' SHARDHERD_* variables and AWS keys, no more.

        No worker id (the job names itself) and not the stack's own record-key directory.
        """
        env = {name: value for name, value in self._env.items()
               if name.startswith("SHARDHERD_") and name != RECORDS_DIR_ENV}
        env.setdefault("SHARDHERD_REGION", self.settings.region)
        env["SHARDHERD_COORDINATOR_URL"] = self.settings.coordinator_url or ",".join(
            child.api_url for child in self.supervisor.children(COORDINATOR) if child.api_url)
        if self.emulators.moto is not None or self.emulators.kinesalite is not None:
            env.update({name: self._env[name] for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
        return env

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Stop in order: producer, coordinators, agents, emulators; remove the state file and socket; unlock.

        Agents get FLEET_STOP: with every agent stopping there is nobody to hand leases to, so each checkpoints and
        gives its leases back at once instead of waiting for a handoff that cannot come.
        """
        if not self._owner:
            return
        self.restarts.close()
        (self.options.run_dir / STATE_FILE).unlink(missing_ok=True)
        (self.options.run_dir / JOB_ENV_FILE).unlink(missing_ok=True)
        if self.control is not None:
            self.control.stop()
            self.control = None
        if self.producer is not None:
            self.producer.stop()
        # Coordinators first: a leader still running would hand leases given back by one agent to another that is
        # about to stop too. Their loops stop at the signal; the agents need not wait for their processes to exit.
        coordinators = self.supervisor.children(COORDINATOR)
        self.supervisor.ask_to_stop(coordinators, signal.SIGTERM)
        started = time.monotonic()
        self.supervisor.stop(self.supervisor.children(AGENT), self.options.stop_grace, FLEET_STOP)
        log.info("agents stopped after %.1f s", time.monotonic() - started)
        self.supervisor.stop(coordinators, 15.0)
        self.emulators.stop()
        self._lock.release()
        self._owner = False


def _listening(child: Child) -> bool:
    """True once `child` itself listens on its port (another program answering on that port does not count)."""
    try:
        connections = psutil.Process(child.pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == child.port
               for conn in connections)


def _wait_for_api(coordinator: Child, timeout: float) -> None:
    """Wait until the replica listens on its API port; StackFailed with its log if it dies or times out first."""
    try:
        wait_until(lambda: _listening(coordinator), timeout, f"{coordinator.name} API on port {coordinator.port}",
                   lambda: coordinator.alive)
    except RuntimeError as exc:
        raise StackFailed(f"{exc}; its log ends with:\n{log_tail(coordinator.log_path).rstrip()}") from exc
