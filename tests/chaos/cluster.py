"""A whole shardherd deployment on loopback for fault injection: real processes, one chaos proxy per process.

Coordinator replicas (`shardherd coordinator`) and agents (`shardherd agent` with the checkpoint-ledger processor) run
as child processes. Each one reaches the DynamoDB emulator through its own ChaosProxy, so a fault can hit everyone
(throttling burst) or one agent (partition). A producer thread puts records and ledgers every acknowledged one; a
sampler thread reads the lease table and the leader lock directly (no proxy) for the after-run checks. Every fault
the harness injects is logged as an Event with its wall time.

Other worker kinds (the Spark driver) plug in through `agent_command`: any process that reads the stream through
shardherd and writes the same ledgers (LEDGER_ENV names its delivery file) can be put under the same faults.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from shardherd.services.emulators.ports import free_port
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.config import Settings, load_settings
from shardherd.shared.lease import Lease
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.shard_lister import list_shards
from shardherd.shared.shards import Shard
from shardherd.shared.store import TableNames
from tests.chaos.ledgers import Produced, ProducerLedger
from tests.support.chaos_proxy import CALM, Chaos, ChaosProxy
from tests.support.cpu_fixtures import CpuFleet
from tests.support.file_ledger import LEDGER_ENV
from tests.support.waiting import wait_for

PROCESSOR = "tests.chaos.ledgers:CheckpointLedgerProcessor"
RESTART_FIRST_SECONDS = 2.0  # the restarter's first backoff (start_restarter), doubled at each restart
RESTART_CAP_SECONDS = 20.0
RESTART_POLL_SECONDS = 0.25
PRODUCER_STOP_SECONDS = 30.0  # a PutRecords in flight at the stop: longer than any call the producer makes
AgentCommand = Callable[[float], list[str]]
_apps = itertools.count()


def plain_agent_command(skew_seconds: float) -> list[str]:
    """`shardherd agent` with the checkpoint-ledger processor, under the skew launcher when the clock is skewed."""
    tail = ["agent", "--processor", PROCESSOR]
    if skew_seconds:
        return [sys.executable, "-m", "tests.chaos.skewed", str(skew_seconds), *tail]
    return [sys.executable, "-m", "shardherd", *tail]



@dataclass(frozen=True, slots=True)
class Event:
    """A fault or lifecycle step the harness performed, at wall time `time`."""

    time: float
    kind: str
    target: str = ""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """The parts of a lease row the checks need."""

    owner: str | None
    checkpoint_owner: str | None
    checkpoint: Checkpoint
    parents: frozenset[str]

    @classmethod
    def of(cls, lease: Lease) -> LeaseRow:
        """Project a lease."""
        return cls(lease.lease_owner, lease.checkpoint_owner, lease.checkpoint, lease.parent_shard_ids)


@dataclass(frozen=True, slots=True)
class Sample:
    """The lease table and the leader lock's holder at one moment."""

    time: float
    leases: dict[str, LeaseRow]
    leader: str | None


@dataclass
class Member:
    """One child process of the cluster (agent or coordinator) and its proxy."""

    name: str
    process: subprocess.Popen[bytes]
    proxy: ChaosProxy
    log: IO[bytes]
    skew: float = 0.0
    started: float = field(default_factory=time.time)
    ended: float | None = None
    how: str = ""  # how it ended: kill, term, close
    ready: float | None = None  # when the sampler first saw it usable by the leader (heartbeat, and CPU report if on)
    port: int | None = None  # a coordinator's API port when the cluster chose it (channel_slots)
    kinesis_proxy: ChaosProxy | None = None  # its own proxy to Kinesis when the cluster proxies Kinesis too
    command: list[str] = field(default_factory=list)  # how it was started: a restart runs the same again
    env: dict[str, str] = field(default_factory=dict)
    restarts: int = 0  # times the cluster's restarter started it again after it exited on its own

    @property
    def alive(self) -> bool:
        """True until the process has been signalled to end."""
        return self.ended is None


class ChaosCluster:
    """Stream, coordinators, agents, proxies, producer and sampler of one run; `close()` ends every process."""

    def __init__(self, moto_url: str, kinesis_url: str, workdir: Path, shards: int = 4,
                 overrides: dict[str, str] | None = None, seed: int = 7,
                 agent_command: AgentCommand = plain_agent_command, channel_slots: int = 0,
                 proxy_kinesis: bool = False, coordinator_command: tuple[str, ...] = ()) -> None:
        self.moto_url = moto_url
        self.kinesis_url = kinesis_url
        self.proxy_kinesis = proxy_kinesis  # each process also reaches Kinesis through a ChaosProxy of its own
        self.coordinator_command = list(coordinator_command) or [sys.executable, "-m", "shardherd", "coordinator"]
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.agent_command = agent_command
        self.app = f"chaos-{os.getpid()}-{next(_apps):03d}"
        self.kinesis = make_client("kinesis", "us-east-1", kinesis_url)
        self.kinesis.create_stream(StreamName=self.app, ShardCount=shards)
        self.wait_stream_active()
        self.env: dict[str, str] = {
            **os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "SHARDHERD_APPLICATION_NAME": self.app, "SHARDHERD_STREAM_NAME": self.app,
            "SHARDHERD_STORE_BACKEND": "dynamodb", "SHARDHERD_KINESIS_ENDPOINT_URL": kinesis_url,
            "SHARDHERD_API_PORT": "0", **(overrides or {}),
        }
        self.settings: Settings = load_settings(**{
            key[len("SHARDHERD_"):].lower(): value for key, value in self.env.items()
            if key.startswith("SHARDHERD_") and key != LEDGER_ENV})
        from shardherd.shared.dynamo.store import DynamoLeaseStore
        from shardherd.shared.store_factory import open_store

        # With store_backend sql (a SQLite file every process shares) the proxies to DynamoDB carry nothing.
        self.store = open_store(self.settings) if self.settings.store_backend == "sql" else DynamoLeaseStore(
            make_client("dynamodb", "us-east-1", moto_url), TableNames.for_application(self.app))
        self.store.ensure_tables()
        self.events: list[Event] = []
        self.members: dict[str, Member] = {}
        self.samples: list[Sample] = []
        self.producer = ProducerLedger(workdir / "produced.txt")
        self._stop_producer = threading.Event()
        self._stop_sampler = threading.Event()
        self._threads: list[threading.Thread] = []
        self._names = itertools.count(1)
        self._lock = threading.Lock()
        # CPU metrics on (the users' default): each agent gets its own cgroup tree or ECS metadata endpoint.
        self.cpu = None if self.settings.disable_worker_metrics else CpuFleet(workdir / "cpu", self.lease_holders)
        # With `channel_slots`, coordinators serve on that many fixed ports (a restarted replica takes a free slot)
        # and agents get them all as coordinator_url, as `shardherd up` and the Helm chart give theirs.
        self.api_ports = [free_port() for _ in range(channel_slots)]

    # ------------------------------------------------------------------ processes
    def note(self, kind: str, target: str = "", detail: str = "") -> Event:
        """Log a harness event now."""
        event = Event(time.time(), kind, target, detail)
        with self._lock:
            self.events.append(event)
        return event

    def _spawn(self, name: str, command: list[str], env: dict[str, str], skew: float = 0.0) -> Member:
        proxy = ChaosProxy(self.moto_url, seed=self.rng.randrange(2**32)).__enter__()
        env = {**env, "SHARDHERD_WORKER_ID": name, "SHARDHERD_DYNAMODB_ENDPOINT_URL": proxy.endpoint_url}
        kinesis_proxy = None
        if self.proxy_kinesis:
            kinesis_proxy = ChaosProxy(self.kinesis_url, seed=self.rng.randrange(2**32)).__enter__()
            env["SHARDHERD_KINESIS_ENDPOINT_URL"] = kinesis_proxy.endpoint_url
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 (closed in close())
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        member = Member(name, process, proxy, log, skew, kinesis_proxy=kinesis_proxy, command=command, env=env)
        with self._lock:
            self.members[name] = member
        return member

    def start_coordinator(self, extra_env: dict[str, str] | None = None) -> Member:
        """Start one more coordinator replica (`extra_env` on top of the cluster's environment)."""
        name = f"coord-{next(self._names)}"
        self.note("start_coordinator", name)
        env = {**self.env, **(extra_env or {})}
        if self.api_ports:
            taken = {member.port for member in self.coordinators()}
            port = next(port for port in self.api_ports if port not in taken)
            env = {**env, "SHARDHERD_API_PORT": str(port), "SHARDHERD_API_HOST": "127.0.0.1"}
            member = self._spawn(name, self.coordinator_command, env)
            member.port = port
            return member
        return self._spawn(name, self.coordinator_command, env)

    def start_agent(self, skew: float = 0.0, extra_env: dict[str, str] | None = None) -> Member:
        """Start one more agent (wall clock off by `skew` seconds), writing its own ledger file."""
        name = f"agent-{next(self._names)}"
        self.note("start_agent", name, f"skew={skew:+.0f}s" if skew else "")
        env = {**self.env, LEDGER_ENV: str(self.workdir / f"{name}.ledger"), **(extra_env or {})}
        if self.api_ports:
            env["SHARDHERD_COORDINATOR_URL"] = ",".join(f"http://127.0.0.1:{port}" for port in self.api_ports)
        if self.cpu is not None:
            env.update(self.cpu.add(name).settings())
        return self._spawn(name, self.agent_command(skew), env, skew)

    def start_probed_agents(self, count: int) -> list[Member]:
        """Start `count` agents, each serving /healthz and /metrics on a free port of its own (`Member.port`)."""
        agents = []
        for _ in range(count):
            port = free_port()
            agent = self.start_agent(extra_env={"SHARDHERD_AGENT_HEALTH_PORT": str(port)})
            agent.port = port
            agents.append(agent)
        return agents

    def lease_holders(self) -> list[str | None]:
        """Who processes each unfinished lease in the latest lease-table sample (what each agent's CPU follows)."""
        with self._lock:
            latest = self.samples[-1] if self.samples else None
        rows = latest.leases.values() if latest else ()
        return [row.checkpoint_owner or row.owner for row in rows if not row.checkpoint.is_shard_end]

    def agents(self) -> list[Member]:
        """Agents not yet signalled to end."""
        with self._lock:
            return [m for m in self.members.values() if m.name.startswith("agent-") and m.alive]

    def coordinators(self) -> list[Member]:
        """Coordinator replicas not yet signalled to end."""
        with self._lock:
            return [m for m in self.members.values() if m.name.startswith("coord-") and m.alive]

    def kill(self, member: Member) -> Event:
        """SIGKILL a member (no drain, no lock release)."""
        member.how = "kill"  # before the signal: the restarter leaves a member the harness ends alone
        member.process.send_signal(signal.SIGKILL)
        member.process.wait(10)
        event = self.note("kill", member.name)
        member.ended, member.how = event.time, "kill"
        return event

    def terminate(self, member: Member) -> Event:
        """SIGTERM a member (graceful drain); returns at once, the exit is logged when it happens."""
        event = self.note("term", member.name)
        member.ended, member.how = event.time, "term"
        member.process.send_signal(signal.SIGTERM)

        def _reap() -> None:
            code = member.process.wait()
            self.note("exited", member.name, f"code={code}")

        thread = threading.Thread(target=_reap, daemon=True)
        thread.start()
        self._threads.append(thread)
        return event

    def set_chaos(self, members: list[Member], chaos: Chaos, kind: str) -> None:
        """Switch the proxies of `members` to `chaos` and log it."""
        for member in members:
            member.proxy.set(chaos)
        self.note(kind, ",".join(m.name for m in members), "calm" if chaos == CALM else repr(chaos))

    def start_restarter(self, first: float = RESTART_FIRST_SECONDS, cap: float = RESTART_CAP_SECONDS) -> None:
        """Start every member again that exits on its own, as an orchestrator restarts a pod's container.

        Kubernetes (restartPolicy Always, every Deployment) restarts an exited container in place, after a backoff
        that doubles from restart to restart up to a cap (`first`, `cap`: shorter than the kubelet's 10 s and
        5 min, for runs of a minute). The member keeps its name (the worker id, as the pod keeps its name), its
        proxies (a fault on them goes on hitting it), its ledger file and its log. Members the harness ended (kill,
        SIGTERM, close) are left alone.
        """
        thread = threading.Thread(target=self._restart_exited, args=(first, cap), daemon=True, name="restarter")
        thread.start()
        self._threads.append(thread)

    def _restart_exited(self, first: float, cap: float) -> None:
        due: dict[str, float] = {}  # member -> when its restart is due
        while not self._stop_sampler.wait(RESTART_POLL_SECONDS):
            with self._lock:
                members = [m for m in self.members.values() if not m.how and m.process.poll() is not None]
            for member in members:
                if member.name not in due:
                    delay = min(cap, first * 2 ** member.restarts)
                    due[member.name] = time.time() + delay
                    self.note("exited", member.name, f"code={member.process.returncode}; restart in {delay:.1f} s")
                elif time.time() >= due[member.name]:
                    del due[member.name]
                    with self._lock:
                        if member.how:
                            continue
                        member.process = subprocess.Popen(member.command, env=member.env, stdout=member.log,
                                                          stderr=subprocess.STDOUT)
                        member.restarts += 1
                    self.note("restart", member.name, f"restart {member.restarts}")

    # ------------------------------------------------------------------ store views
    def leader(self) -> str | None:
        """The leader lock's holder, None when free or released."""
        item = self.store.get_state("Leader")
        if not item or item.get("isReleased") == "1":
            return None
        owner = item.get("ownerName")
        return owner if isinstance(owner, str) else None

    def leases(self) -> dict[str, Lease]:
        """The lease table now."""
        return {lease.lease_key: lease for lease in self.store.scan_leases().leases}

    def owned_by(self, worker: str) -> list[str]:
        """Unfinished leases whose processing worker is `worker`."""
        return [key for key, lease in self.leases().items() if lease.actual_owner == worker and not lease.is_finished]

    def all_leases_owned_by_live_agents(self) -> bool:
        """True when every unfinished lease is processed by a live agent and every live agent holds one."""
        live = {m.name for m in self.agents()}
        owners = {lease.actual_owner for lease in self.leases().values() if not lease.is_finished}
        return bool(owners) and owners <= live and (len(live) <= len(owners) or owners == live)

    # ------------------------------------------------------------------ stream
    def shards(self) -> list[Shard]:
        """Every shard of the stream, open and closed."""
        return list_shards(self.kinesis, self.app, RetryPolicy())

    def wait_stream_active(self) -> None:
        """Block until the stream is ACTIVE again (after create, split or merge)."""
        wait_for(lambda: self.kinesis.describe_stream_summary(StreamName=self.app)["StreamDescriptionSummary"][
            "StreamStatus"] == "ACTIVE", 60, "stream ACTIVE", period=0.05)

    def split(self) -> Event:
        """Split the open shard with the widest hash range at its middle."""
        open_shards = [s for s in self.shards() if s.ending_sequence_number is None]
        widest = max(open_shards, key=lambda s: int(s.ending_hash_key) - int(s.starting_hash_key))
        middle = (int(widest.starting_hash_key) + int(widest.ending_hash_key)) // 2 + 1
        self.kinesis.split_shard(StreamName=self.app, ShardToSplit=widest.shard_id, NewStartingHashKey=str(middle))
        event = self.note("split", widest.shard_id)
        self.wait_stream_active()
        return event

    def merge(self) -> Event | None:
        """Merge the narrowest pair of adjacent open shards (None if there is no pair)."""
        open_shards = sorted((s for s in self.shards() if s.ending_sequence_number is None),
                             key=lambda s: int(s.starting_hash_key))
        pairs = [(a, b) for a, b in itertools.pairwise(open_shards)
                 if int(a.ending_hash_key) + 1 == int(b.starting_hash_key)]
        if not pairs:
            return None
        low, high = min(pairs, key=lambda p: int(p[1].ending_hash_key) - int(p[0].starting_hash_key))
        self.kinesis.merge_shards(StreamName=self.app, ShardToMerge=low.shard_id,
                                  AdjacentShardToMerge=high.shard_id)
        event = self.note("merge", f"{low.shard_id}+{high.shard_id}")
        self.wait_stream_active()
        return event

    # ------------------------------------------------------------------ producer and sampler
    def start_background(self, rate: float = 40.0, batch: int = 8, sample_period: float = 0.25) -> None:
        """Start the producer (about `rate` records/s in batches) and the lease-table sampler."""
        for target, args in ((self._produce, (rate, batch)), (self._sample, (sample_period,))):
            thread = threading.Thread(target=target, args=args, daemon=True, name=target.__name__.strip("_"))
            thread.start()
            self._threads.append(thread)

    def _produce(self, rate: float, batch: int) -> None:
        counter = itertools.count()
        keys = random.Random(self.rng.randrange(2**32))
        pending: list[str] = []
        while not self._stop_producer.wait(batch / rate):
            pending.extend(f"r{next(counter):07d}" for _ in range(max(0, batch - len(pending))))
            entries: list[Any] = [{"Data": data.encode(), "PartitionKey": str(keys.getrandbits(64))}
                                  for data in pending]
            try:
                reply = self.kinesis.put_records(StreamName=self.app, Records=entries)
            except Exception as exc:  # kinesalite busy resharding: the same records go again
                self.note("put_failed", detail=str(exc)[:100])
                continue
            now = time.time()
            acknowledged, retry = [], []
            for data, result in zip(pending, reply["Records"], strict=True):
                if "SequenceNumber" in result:
                    acknowledged.append(Produced(data, result["ShardId"], int(result["SequenceNumber"]), now))
                else:
                    retry.append(data)
            self.producer.add(acknowledged)
            pending = retry

    def stop_producer(self) -> None:
        """Stop putting records and wait for the last call in flight, so the producer ledger is final on return.

        A PutRecords sent just before the stop is acknowledged after it: a caller that read the ledger at once
        missed those records and could end its drain before they were delivered.
        """
        self._stop_producer.set()
        for thread in self._threads:
            if thread.name == "produce" and thread is not threading.current_thread():
                thread.join(PRODUCER_STOP_SECONDS)

    def _sample(self, period: float) -> None:
        while not self._stop_sampler.wait(period):
            try:
                leases = {key: LeaseRow.of(lease) for key, lease in self.leases().items()}
                sample = Sample(time.time(), leases, self.leader())
                self._note_ready(sample.time)
            except Exception as exc:  # the sampler reads moto directly; a hiccup only costs one sample
                self.note("sample_failed", detail=str(exc)[:100])
                continue
            with self._lock:
                self.samples.append(sample)

    def _note_ready(self, now: float) -> None:
        """Mark agents the leader can use from now: a heartbeat, plus a CPU report when metrics are on.

        Until then the leader leaves a worker out on purpose (a CPU-reporting worker without its first report has
        invalid metrics), so the checks count an agent as live from this moment, measured rather than assumed: on
        a loaded host a fresh process needs anything from 2 to 15 s to import and report.
        """
        waiting = [m for m in self.agents() if m.ready is None]
        if not waiting:
            return
        records = {w.worker_id: w for w in self.store.scan_workers().workers}
        for member in waiting:
            record = records.get(member.name)
            if record is not None and (self.cpu is None or record.metric_stats):
                member.ready = now

    def stop_sampler(self) -> None:
        """Stop sampling."""
        self._stop_sampler.set()

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Kill every process still running, stop the proxies and threads, close the logs."""
        self.stop_producer()
        self.stop_sampler()  # and the restarter
        with self._lock:
            for member in self.members.values():
                member.how = member.how or "close"
        for member in list(self.members.values()):
            if member.process.poll() is None:
                member.process.kill()
                member.process.wait(10)
            if member.ended is None:
                member.ended, member.how = time.time(), "close"
            member.proxy.__exit__(None, None, None)
            if member.kinesis_proxy is not None:
                member.kinesis_proxy.__exit__(None, None, None)
            member.log.close()
        for thread in self._threads:
            thread.join(10)
        if self.cpu is not None:
            self.cpu.close()
        self.store.close()
