"""The fault matrix: one cell = one fault injected into a fresh loopback deployment, measured from the ledgers.

Invariants:
- Every cell starts from the same fleet (2 coordinator replicas serving the assignment channel, 3 agents, 4 shards,
  CPU metrics on, a steady producer), every process behind its own ChaosProxy to DynamoDB and to Kinesis, its
  credentials from a container credentials endpoint on 127.0.0.1, and a fault-injection hook (tests/chaos/inject.py).
- A process that exits on its own is started again, under the same name and proxies, after 2, 4, 8 ... s (at most
  20 s), as Kubernetes restarts a pod's container (`ChaosCluster.start_restarter`); the harness's kills stay dead.
- A fault starts at `t0` and lasts `hold` seconds; then it is healed and the fleet watched for failover + 8 s more.
  A cell with `probe` also kill -9s one other agent 2 s into the fault: can the fleet still fail over meanwhile?
- The figures come only from what processes did (delivery and checkpoint ledgers), the lease table sampled every
  0.25 s, the coordinators' health endpoints polled every 0.25 s, and the processes' logs; nothing is assumed.

Figures per cell (seconds from t0 unless said):
- `read again`: until every shard open at t0 is read again after its longest delivery gap over STALL_GAP (0 when no
  shard stalled; None when a shard was never read again before the producer stopped);
- `held unread`: the longest time any lease was held by a worker that delivered none of its records meanwhile;
- `moved`: from the fault until the victim agent's shards are all read by another worker, and `probe moved` from the
  probe's kill until its shards are (inf, shown "never": some shard was not read elsewhere before the end);
- `leader`: another replica holding the leader lock, when the victim is the leader; in any other cell, another
  replica than the one leading at t0 (the lead moved although the fault did not target it);
- `red`: the first of two failed answers in a row to /healthz (of a coordinator, or of an agent where agents serve
  one), and the same for /readyz (coordinators), of a process the harness did not kill;
- `lost` (records never delivered although their shard's checkpoint passed them: skipped for good; must be 0),
  `stranded` (records not delivered by the end of the run, DRAIN_SECONDS after the producer stopped, and still
  behind their shard's checkpoint: stuck behind a stalled lease, read once someone reads the shard again),
  `dups` (redeliveries) and `dups covered` (redeliveries of records a checkpoint already covered: must be 0),
  `late` (deliveries by a stopped process after it resumed, of shards another worker then held), the threads that died
  with a traceback ("Exception in thread ..." in a log), and the names of the chaos suite's checks that failed.
"""

from __future__ import annotations

import itertools
import math
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypedDict, TypeVar

import psutil

from shardherd.services.emulators.ports import free_port
from shardherd.shared.config import Settings
from tests.chaos.analysis import RunData, Timing, _resumed_elsewhere, analyse
from tests.chaos.cluster import PROCESSOR, ChaosCluster, Member, Sample
from tests.chaos.inject import INJECT_ENV
from tests.chaos.ledgers import CheckpointMark, Delivery, read_deliveries
from tests.chaos.scenario import SHORT_INTERVALS
from tests.support.chaos_proxy import CALM, Chaos
from tests.support.credentials_endpoint import CredentialsEndpoint
from tests.support.faulty_proxy import THROTTLED, Fault
from tests.support.waiting import wait_for

DISK_MB = 32
OBSERVED = "observed.pickle"
# Agents serve /healthz where the code has the setting (agent_health_port); the poller then watches them too.
AGENT_HEALTH = "agent_health_port" in Settings.model_fields
RED_POLLS = 2
START_SECONDS = 180.0  # a fleet's start-up on a loaded 2-core host (a Spark driver's JVM and query included)
DRAIN_SECONDS = 60.0  # after the producer stops, how long the fleet may take to deliver the rest (a loaded host)
STALL_GAP = 3.0  # a shard whose deliveries pause longer than this stalled (gaps stay under 1 s on an idle host, 2-3 s
# on a 2-core host at load 20 while processes start)
PROBE_DELAY = 2.0
API_TOKEN = "fault-matrix-token-0001"
ROTATED_TOKEN = "fault-matrix-token-0002"
ACCESS_DENIED = Fault(400, "AccessDeniedException")
EXPIRED_TOKEN = Fault(400, "ExpiredTokenException")
MALFORMED_200 = Fault(200, raw=b"<html><body>502 Bad Gateway (from a proxy)</body></html>")
INJECT_COMMAND = [sys.executable, "-m", "tests.chaos.inject"]


@dataclass
class Run:
    """One cell's live deployment: the cluster, its credentials endpoint, the victim and the health samples."""

    cluster: ChaosCluster
    credentials: CredentialsEndpoint
    token_file: Path
    victim: Member | None = None
    probe: Member | None = None
    t0: float = 0.0
    health: list[tuple[float, str, str, int]] = field(default_factory=list)  # time, member, path, status (0: none)
    jump: float = 0.0  # seconds the victim's wall clock stepped

    @property
    def failover(self) -> float:
        """The failover time in seconds."""
        return self.cluster.settings.failover_time_millis / 1000

    def leader_member(self) -> Member:
        """The coordinator replica holding the leader lock."""
        wait_for(lambda: self.cluster.leader() is not None, 30, "a leader")
        name = self.cluster.leader()
        return next(m for m in self.cluster.coordinators() if m.name == name)

    def busiest_agent(self, exclude: Member | None = None) -> Member:
        """The live agent processing the most leases."""
        agents = [m for m in self.cluster.agents() if m is not exclude]
        return max(agents, key=lambda m: (len(self.cluster.owned_by(m.name)), m.name))

    def inject(self, member: Member, command: str) -> None:
        """Hand a command to the member's injection hook; wait (5 s at most) until it was done or the process ended."""
        control = self.cluster.workdir / f"{member.name}.inject"
        done = Path(f"{control}.done")
        before = done.read_text(encoding="utf-8") if done.exists() else ""
        control.write_text(command + "\n", encoding="utf-8")
        # A process whose supervisor gives up on the failed thread may exit before the hook reports.
        wait_for(lambda: (done.exists() and done.read_text(encoding="utf-8") != before)
                 or member.process.poll() is not None, 5, f"inject {command}")
        report = done.read_text(encoding="utf-8")[len(before):].strip() if done.exists() else ""
        self.cluster.note("inject", member.name, report or f"process exited with {member.process.poll()}")


Step = Callable[[Run], None]


@dataclass(frozen=True)
class Cell:
    """One fault: what it does (for the doc), how to inject and heal it, how long it lasts, whether to probe."""

    name: str
    does: str
    inject: Step
    heal: Step = lambda run: None
    hold: float = 10.0
    probe: bool = False
    disk: str = ""  # "store": the store is a SQLite file on a tmpfs of the cell's own; "spark": Spark's files are
    spark: bool = False  # the agents are Spark drivers (tests/chaos/spark_ledger_driver.py), 2 of them, no probe


@dataclass
class Result:
    """One cell's figures (see the module docstring)."""

    cell: str
    read_again: float | None
    held_unread: float
    moved: float | None
    probe_moved: float | None
    leader: float | None
    healthz_red: float | None
    readyz_red: float | None
    lost: int
    stranded: int
    produced: int
    dups: int
    dups_covered: int
    late: int
    dead_threads: list[str]
    failed_checks: list[str]
    notes: list[str] = field(default_factory=list)
    probe_owned: float | None = None  # from the probe's kill until live workers own every lease it held


@dataclass
class Observed:
    """What one cell left behind, in plain data (pickled next to its logs, so figures can be computed again)."""

    cell: str
    t0: float
    stopped: float  # when the producer stopped
    victim: str | None
    probe: str | None
    killed: set[str]
    health: list[tuple[float, str, str, int]]
    data: RunData
    dead_threads: list[str]
    jump: float = 0.0  # seconds the victim's wall clock stepped (its ledger times are undone before measuring)

    def save(self, path: Path) -> None:
        """Pickle to `path`."""
        path.write_bytes(pickle.dumps(self))

    @classmethod
    def load(cls, path: Path) -> Observed:
        """Read a pickle written by `save` (the harness's own files only)."""
        observed = pickle.loads(path.read_bytes())  # the harness reads only its own files
        assert isinstance(observed, cls)
        return observed


# ---------------------------------------------------------------------------------------------- fault steps
def _proxies(members: list[Member], chaos: Chaos, kinesis: bool) -> None:
    for member in members:
        proxy = member.kinesis_proxy if kinesis else member.proxy
        if proxy is not None:
            proxy.set(chaos)


def store_fault(chaos: Chaos, who: str) -> tuple[Step, Step]:
    """Inject and heal `chaos` on the DynamoDB proxies of `who` (agent, leader, all)."""
    return _proxy_fault(chaos, who, kinesis=False)


def kinesis_fault(chaos: Chaos, who: str) -> tuple[Step, Step]:
    """Inject and heal `chaos` on the Kinesis proxies of `who` (agent, leader, all)."""
    return _proxy_fault(chaos, who, kinesis=True)


def _targets(run: Run, who: str) -> list[Member]:
    if who == "all":
        return [m for m in run.cluster.members.values() if m.alive]
    run.victim = run.leader_member() if who == "leader" else run.busiest_agent()
    return [run.victim]


def _proxy_fault(chaos: Chaos, who: str, kinesis: bool) -> tuple[Step, Step]:
    hit: list[Member] = []

    def inject(run: Run) -> None:
        hit[:] = _targets(run, who)
        _proxies(hit, chaos, kinesis)

    def heal(run: Run) -> None:
        _proxies(hit, CALM, kinesis)

    return inject, heal


def credentials_fault() -> tuple[Step, Step]:
    """The credential source every process shares starts failing (no single victim)."""
    def inject(run: Run) -> None:
        run.credentials.failing = True

    def heal(run: Run) -> None:
        run.credentials.failing = False

    return inject, heal


def kill_victim(who: str) -> Step:
    """kill -9 of the busiest agent or of the leader."""
    def inject(run: Run) -> None:
        run.victim = run.leader_member() if who == "leader" else run.busiest_agent()
        run.cluster.kill(run.victim)

    return inject


def kill_jvm() -> Step:
    """kill -9 of the busiest Spark driver's JVM (the Python driver process lives on)."""
    def inject(run: Run) -> None:
        run.victim = run.busiest_agent()
        children = psutil.Process(run.victim.process.pid).children(recursive=True)
        jvms = [child for child in children if child.name() == "java"]
        for jvm in jvms:
            jvm.send_signal(signal.SIGKILL)
        run.cluster.note("kill_jvm", run.victim.name, f"{len(jvms)} JVM(s)")

    return inject


def stop_victim(who: str) -> tuple[Step, Step]:
    """SIGSTOP of the busiest agent or of the leader, SIGCONT at heal (a long GC pause)."""
    def inject(run: Run) -> None:
        run.victim = run.leader_member() if who == "leader" else run.busiest_agent()
        run.victim.process.send_signal(signal.SIGSTOP)
        run.cluster.note("sigstop", run.victim.name)

    def heal(run: Run) -> None:
        assert run.victim is not None
        run.victim.process.send_signal(signal.SIGCONT)
        run.cluster.note("sigcont", run.victim.name)

    return inject, heal


def raise_in_thread(who: str, thread: str, verb: str = "raise") -> Step:
    """An exception raised once inside the named thread(s) of the busiest agent or of the leader (`die`: one that
    ends the thread, tests/chaos/inject.py)."""
    def inject(run: Run) -> None:
        run.victim = run.leader_member() if who == "leader" else run.busiest_agent()
        run.inject(run.victim, f"{verb} {thread}")

    return inject


def clock_jump(seconds: float) -> Step:
    """The busiest agent's wall clock steps by `seconds`."""
    def inject(run: Run) -> None:
        run.victim = run.busiest_agent()
        run.inject(run.victim, f"jump {seconds}")
        run.jump = seconds

    return inject


def coordinators_down() -> tuple[Step, Step]:
    """kill -9 of every coordinator replica (the API and the leader gone); heal starts two new ones."""
    def inject(run: Run) -> None:
        for member in run.cluster.coordinators():
            run.cluster.kill(member)

    def heal(run: Run) -> None:
        for _ in range(2):
            run.cluster.start_coordinator(_coordinator_env(run))

    return inject, heal


def rotate_token() -> Step:
    """The API token file gets a new token: coordinators re-read it, agents keep the one they read at start."""
    def inject(run: Run) -> None:
        run.token_file.write_text(ROTATED_TOKEN, encoding="utf-8")
        run.cluster.note("rotate_token")

    return inject


def disk_full() -> tuple[Step, Step]:
    """The store's filesystem fills up (a file takes every free byte); heal deletes that file."""
    def inject(run: Run) -> None:
        with open(_disk(run) / "filler", "wb") as filler:
            try:
                while True:
                    filler.write(b"\0" * (1 << 20))
                    filler.flush()
            except OSError as exc:
                run.cluster.note("disk_full", detail=str(exc))

    def heal(run: Run) -> None:
        (_disk(run) / "filler").unlink()

    return inject, heal


def disk_read_only() -> tuple[Step, Step]:
    """The store's filesystem is remounted read-only; heal remounts it read-write."""
    def inject(run: Run) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(_disk(run))], check=True)

    def heal(run: Run) -> None:
        subprocess.run(["mount", "-o", "remount,rw", str(_disk(run))], check=True)

    return inject, heal


# The write syscalls SQLite makes on a WAL store's files (`strace -c` of a writing process: pwrite64 on the database
# and its -wal file, fdatasync, ftruncate, unlink at close); its -shm file is written through mmap, as on any
# filesystem. On a read-only filesystem each fails with EROFS.
SQLITE_WRITES = "pwrite64,write,fsync,fdatasync,ftruncate,unlink,unlinkat"


def store_read_only() -> tuple[Step, Step]:
    """Every process's writes to the SQLite store's files fail with EROFS from the kernel; heal lets them through.

    A remount cannot do it (the kernel refuses to make a filesystem read-only while a file on it is open for writing:
    `mount` answers busy), so `strace` attaches to every process and injects EROFS into SQLITE_WRITES on the store's
    files (`-P`): what a process sees under a filesystem the kernel remounted read-only beneath its open files
    (`errors=remount-ro`). Opening files and reading them still work, as they do there. Heal detaches strace.
    """
    tracers: list[subprocess.Popen[bytes]] = []

    def inject(run: Run) -> None:
        db = _disk(run) / "store.db"
        pids = [m.process.pid for m in run.cluster.members.values() if m.alive]
        tracers[:] = erofs_tracers(pids, [db, Path(f"{db}-wal"), Path(f"{db}-journal")])
        run.cluster.note("read_only", detail=f"{len(pids)} processes")

    def heal(run: Run) -> None:
        detach(tracers)

    return inject, heal


def erofs_tracers(pids: list[int], files: list[Path]) -> list[subprocess.Popen[bytes]]:
    """Attach strace to each process (every thread): its SQLITE_WRITES on `files` fail with EROFS until `detach`.

    Returns once every thread of every process is traced, so the fault is in force for each write after the call.
    """
    paths = [arg for path in files for arg in ("-P", str(path))]
    tracers = [subprocess.Popen(["strace", "-f", "-qq", "-p", str(pid), *paths, "-e", f"trace={SQLITE_WRITES}",
                                 "-e", f"inject={SQLITE_WRITES}:error=EROFS", "-o", "/dev/null"]) for pid in pids]
    wait_for(lambda: all(_traced(pid) for pid in pids), 10, "strace attached to every process")
    return tracers


def detach(tracers: list[subprocess.Popen[bytes]]) -> None:
    """End the tracers: strace detaches and each process goes on, its writes passing again."""
    for tracer in tracers:
        tracer.terminate()
    for tracer in tracers:
        tracer.wait(10)


def _traced(pid: int) -> bool:
    """True when every thread of `pid` (gone counts as traced) has a tracer."""
    try:
        threads = psutil.Process(pid).threads()
        return all("TracerPid:\t0\n" not in Path(f"/proc/{pid}/task/{t.id}/status").read_text() for t in threads)
    except (psutil.NoSuchProcess, FileNotFoundError):
        return True


def _disk(run: Run) -> Path:
    return run.cluster.workdir / "disk"


class Steps(TypedDict):
    """A fault's inject and heal steps, as Cell's keyword arguments."""

    inject: Step
    heal: Step


def _pair(steps: tuple[Step, Step]) -> Steps:
    return {"inject": steps[0], "heal": steps[1]}


# The cells the findings point at first, so a bench cut short still measured them.
FIRST = ("kill -9 agent", "exception in leader leader-loop", "Kinesis unreachable (hang), leader",
         "DynamoDB AccessDenied, leader", "SIGSTOP agent 2x failover", "exception in agent shard", "kill -9 leader",
         "credentials fail to refresh, all", "Kinesis unreachable (hang), all", "Kinesis malformed 200, agent",
         "exception in agent lease-keeper", "coordinator API down", "coordinator API 401 (token rotated)")


def cells() -> list[Cell]:
    """Every cell of the plain-agent matrix, in the order the bench runs them (FIRST, then the rest)."""
    catalogue = _catalogue()
    return sorted(catalogue, key=lambda c: FIRST.index(c.name) if c.name in FIRST else len(FIRST))


def _catalogue() -> list[Cell]:
    hang, slow = Chaos(hang=True), Chaos(latency=1.0)
    return [
        Cell("kill -9 agent", "SIGKILL of the busiest agent", kill_victim("agent")),
        Cell("kill -9 leader", "SIGKILL of the leader replica", kill_victim("leader"), probe=True),
        Cell("SIGSTOP agent 2x failover", "the busiest agent frozen for 2 failover times + 2 s, then SIGCONT",
             hold=8.0, **_pair(stop_victim("agent"))),
        Cell("SIGSTOP leader 2x failover", "the leader frozen for 2 failover times + 2 s, then SIGCONT",
             hold=8.0, probe=True, **_pair(stop_victim("leader"))),
        Cell("DynamoDB throttling, all", "80% of every process's DynamoDB calls answered 400 throughput exceeded",
             **_pair(store_fault(Chaos(throttle_rate=0.8), "all"))),
        Cell("DynamoDB 5xx, all", "80% of every process's DynamoDB calls answered 500", probe=True,
             **_pair(store_fault(Chaos(error_rate=0.8), "all"))),
        _replies_lost(probe=True),
        Cell("DynamoDB slow, all", "every DynamoDB call of every process answered 1 s late", probe=True,
             **_pair(store_fault(slow, "all"))),
        Cell("DynamoDB hang, agent", "the busiest agent's DynamoDB calls hang until its client times out",
             **_pair(store_fault(hang, "agent"))),
        Cell("DynamoDB hang, leader", "the leader's DynamoDB calls hang until its client times out", hold=15.0,
             probe=True, **_pair(store_fault(hang, "leader"))),
        Cell("DynamoDB AccessDenied, agent", "every DynamoDB call of the busiest agent answered AccessDenied",
             **_pair(store_fault(Chaos(reply=ACCESS_DENIED), "agent"))),
        Cell("DynamoDB AccessDenied, leader", "every DynamoDB call of the leader answered AccessDenied", hold=15.0,
             probe=True, **_pair(store_fault(Chaos(reply=ACCESS_DENIED), "leader"))),
        Cell("credentials fail to refresh, all", "the container credentials endpoint answers 500 while credentials "
             "are due for refresh (every process)", hold=15.0, **_pair(credentials_fault())),
        Cell("Kinesis unreachable (hang), all", "every Kinesis call of every process hangs until its client times "
             "out", hold=20.0, probe=True, **_pair(kinesis_fault(hang, "all"))),
        Cell("Kinesis blackholed 5 min, all", "every Kinesis call of every process hangs for 5 minutes (the issue's "
             "blackhole)", hold=300.0, probe=True, **_pair(kinesis_fault(hang, "all"))),
        Cell("Kinesis SYN-blackholed, all", "no process's new Kinesis connection is accepted (SYNs dropped: connect "
             "timeouts) and requests on open ones hang", hold=20.0, probe=True,
             **_pair(kinesis_fault(Chaos(syn_dropped=True), "all"))),
        Cell("Kinesis unreachable (hang), leader", "the leader's Kinesis calls (shard sync) hang", hold=20.0,
             probe=True, **_pair(kinesis_fault(hang, "leader"))),
        Cell("Kinesis unreachable (hang), agent", "the busiest agent's Kinesis calls hang",
             **_pair(kinesis_fault(hang, "agent"))),
        Cell("Kinesis throttled, agent", "every Kinesis call of the busiest agent answered 400 throughput exceeded",
             **_pair(kinesis_fault(Chaos(reply=THROTTLED), "agent"))),
        Cell("Kinesis malformed 200, agent", "every Kinesis call of the busiest agent answered 200 with an HTML body",
             **_pair(kinesis_fault(Chaos(reply=MALFORMED_200), "agent"))),
        Cell("Kinesis ExpiredToken, agent", "every Kinesis call of the busiest agent answered ExpiredTokenException",
             **_pair(kinesis_fault(Chaos(reply=EXPIRED_TOKEN), "agent"))),
        Cell("coordinator API down", "SIGKILL of both replicas; two new ones start after the hold",
             **_pair(coordinators_down())),
        Cell("coordinator API 401 (token rotated)", "the token file changes; agents keep the old token",
             rotate_token(), probe=True),
        *[Cell(f"exception in agent {thread}", f"an exception raised inside the busiest agent's {thread} thread(s)",
               raise_in_thread("agent", thread), probe=True)
          for thread in ("lease-keeper", "heartbeat", "assignment-watch", "assignment-news",
                         "shardherd-cpu-sampler", "shard")],
        Cell("agent shard threads die", "an exception no `except Exception` catches ends the busiest agent's shard "
             "threads", raise_in_thread("agent", "shard-shardId", "die"), probe=True),
        *[Cell(f"exception in leader {thread}", f"an exception raised inside the leader's {thread} thread",
               raise_in_thread("leader", thread), probe=True)
          for thread in ("leader-loop", "LockKeeper", "replica-report")],
        Cell("SQLite disk full", "the SQLite store's filesystem has no free byte left (every process shares the "
             "file)", disk="store", **_pair(disk_full())),
        Cell("SQLite read-only", "every process's writes to the SQLite store's files fail with EROFS, as on a "
             "filesystem remounted read-only under them (strace injects the kernel's error)", disk="store",
             **_pair(store_read_only())),
        Cell("agent clock jumps +300 s", "the busiest agent's wall clock steps 300 s ahead", clock_jump(300.0)),
        Cell("agent clock jumps -300 s", "the busiest agent's wall clock steps 300 s back", clock_jump(-300.0)),
    ]


def _replies_lost(probe: bool = False) -> Cell:
    """A share of every process's DynamoDB writes applied, their replies lost: each is retried after it landed."""
    return Cell("DynamoDB replies lost, all", "30% of every process's DynamoDB writes applied, then their connection "
                "dropped unanswered (the store retries a write that already landed)", probe=probe,
                **_pair(store_fault(Chaos(lost_reply_rate=0.3, writes_only=True), "all")))


def spark_cells() -> list[Cell]:
    """The Spark-driver cells (2 drivers, each its own JVM in local mode)."""
    return [Cell(f"Spark: {cell.name}", cell.does.replace("agent", "Spark driver"), cell.inject, cell.heal, cell.hold,
                 disk=cell.disk, spark=True) for cell in [
        Cell("kill -9 agent", "SIGKILL of the busiest agent", kill_victim("agent")),
        Cell("kill -9 JVM", "SIGKILL of the busiest agent's JVM", kill_jvm()),
        Cell("SIGSTOP agent 2x failover", "the busiest agent frozen for 2 failover times + 2 s, then SIGCONT", hold=8.0,
             **_pair(stop_victim("agent"))),
        Cell("exception in agent shard-prober", "an exception raised inside the busiest agent's shard-prober thread",
             raise_in_thread("agent", "shard-prober")),
        Cell("exception in agent spark-supervisor", "an exception raised inside the busiest agent's "
             "spark-supervisor thread", raise_in_thread("agent", "spark-supervisor")),
        Cell("exception in agent lease-keeper", "an exception raised inside the busiest agent's lease-keeper thread",
             raise_in_thread("agent", "lease-keeper")),
        Cell("Kinesis malformed 200, agent", "every Kinesis call of the busiest agent answered 200 with an HTML body",
             **_pair(kinesis_fault(Chaos(reply=MALFORMED_200), "agent"))),
        Cell("credentials fail to refresh, all", "the container credentials endpoint answers 500 while credentials "
             "are due for refresh (every process)", hold=15.0, **_pair(credentials_fault())),
        Cell("channel and checkpoint disk full", "the filesystem of every agent's channel and Spark checkpoint "
             "directories has no free byte left", disk="spark", **_pair(disk_full())),
        Cell("channel and checkpoint read-only", "the filesystem of every agent's channel and Spark checkpoint "
             "directories is remounted read-only", disk="spark", **_pair(disk_read_only())),
        _replies_lost(),
    ]]


# ---------------------------------------------------------------------------------------------- running a cell
def _coordinator_env(run: Run) -> dict[str, str]:
    return {**run.credentials.env(), INJECT_ENV: str(run.cluster.workdir)}


def _agent_command(skew: float) -> list[str]:
    return [*INJECT_COMMAND, "agent", "--processor", PROCESSOR]


def _spark_command(files: Path) -> Callable[[float], list[str]]:
    files.mkdir(parents=True, exist_ok=True)
    return lambda skew: [*INJECT_COMMAND, "-m", "tests.chaos.spark_ledger_driver", "--dir", str(files)]


def marks_from_samples(samples: list[Sample]) -> list[CheckpointMark]:
    """Checkpoint marks from the sampled lease table (a Spark agent checkpoints after its sink returned).

    Each mark carries the first sample time showing that checkpoint: later than the write, never earlier, so a
    redelivery is judged covered only once the checkpoint certainly existed.
    """
    marks: list[CheckpointMark] = []
    seen: dict[str, int] = {}
    for sample in samples:
        for key, row in sample.leases.items():
            value = row.checkpoint.sequence_value
            if value is not None and seen.get(key) != value:
                seen[key] = value
                marks.append(CheckpointMark(key, value, row.checkpoint.sub_sequence_number,
                                            row.checkpoint_owner or row.owner or "?", sample.time))
    return marks


class HealthPoller:
    """Polls every coordinator's /healthz and /readyz, and agents' /healthz if served, into `run.health`."""

    def __init__(self, run: Run, period: float = 0.25) -> None:
        self.run = run
        self.period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="health-poller", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.period):
            for member in self.run.cluster.coordinators():
                for path in ("/healthz", "/readyz"):
                    self.run.health.append((time.time(), member.name, path, _status(member.port, path)))
            for member in self.run.cluster.agents():
                if member.port is not None:
                    self.run.health.append((time.time(), member.name, "/healthz", _status(member.port, "/healthz")))

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()
        self._thread.join(5)


def _status(port: int | None, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2.0) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def run_cell(cell: Cell, moto_url: str, kinesis_url: str, workdir: Path, log: Callable[[str], None] = print,
             overrides: dict[str, str] | None = None, agents: int = 3, watch: float = 8.0,
             defaults: bool = False) -> Result:
    """Bring a fresh fleet up, inject `cell`'s fault, heal it, watch for failover + `watch` s, and measure.

    `defaults`: shardherd's default timings (failover 10 s, assignment interval 2 s) instead of the short ones.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    token_file = workdir / "api-token"
    token_file.write_text(API_TOKEN, encoding="utf-8")
    env = {**({} if defaults else SHORT_INTERVALS), "SHARDHERD_API_TOKEN_FILE": str(token_file), **(overrides or {})}
    if cell.disk:
        _mount(workdir / "disk")
    if cell.disk == "store":
        env.update(SHARDHERD_STORE_BACKEND="sql", SHARDHERD_SQL_URL=f"sqlite:///{workdir / 'disk'}/store.db")
    try:
        return _run_cell(cell, moto_url, kinesis_url, workdir, log, env, agents, watch)
    finally:
        if cell.disk:
            subprocess.run(["umount", "-l", str(workdir / "disk")], check=False)


def _mount(path: Path) -> Path:
    """A fresh tmpfs of DISK_MB at `path` (the disk cells' store filesystem)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(path)], check=True)
    return path


def _run_cell(cell: Cell, moto_url: str, kinesis_url: str, workdir: Path, log: Callable[[str], None],
              env: dict[str, str], agents: int, watch: float) -> Result:
    with CredentialsEndpoint() as credentials:
        files = workdir / ("disk" if cell.disk == "spark" else "spark")
        cluster = ChaosCluster(moto_url, kinesis_url, workdir, shards=4, overrides=env,
                               agent_command=_spark_command(files) if cell.spark else _agent_command,
                               channel_slots=2, proxy_kinesis=True, coordinator_command=tuple(
                                   [*INJECT_COMMAND, "coordinator"]))
        run = Run(cluster, credentials, workdir / "api-token")
        poller: HealthPoller | None = None
        try:
            cluster.start_restarter()  # processes that exit start again, as their pods would
            _start_fleet(run, 2 if cell.spark else agents)
            poller = HealthPoller(run)
            run.t0 = cluster.note("fault", cell.name).time
            cell.inject(run)
            _probe(run, cell)
            time.sleep(max(0.0, run.t0 + cell.hold - time.time()))
            cell.heal(run)
            cluster.note("heal", cell.name)
            time.sleep(run.failover + watch)
            stopped = cluster.note("stop_producer").time
            cluster.stop_producer()
            _drain(cluster, log)
            poller.stop()
            cluster.stop_sampler()
            timing = Timing(run.failover, cluster.settings.lease_assignment_interval_millis / 1000, 0.25)
            data = RunData.collect(cluster, timing)
            if cell.spark:
                data.checkpoints = marks_from_samples(data.samples)
            observed = Observed(cell.name, run.t0, stopped, run.victim.name if run.victim else None,
                                run.probe.name if run.probe else None,
                                {m.name for m in cluster.members.values() if m.how == "kill"}, list(run.health),
                                data, dead_threads(workdir), run.jump)
            observed.save(workdir / OBSERVED)
            return measure(observed)
        finally:
            if poller is not None:
                poller.stop()
            cluster.close()


def _start_fleet(run: Run, agents: int) -> None:
    cluster = run.cluster
    for _ in range(2):
        cluster.start_coordinator(_coordinator_env(run))
    wait_for(lambda: cluster.leader() is not None, START_SECONDS, "a leader")
    for _ in range(agents):
        extra = {**run.credentials.env(), INJECT_ENV: str(cluster.workdir)}
        port = free_port() if AGENT_HEALTH else None
        if port is not None:
            extra["SHARDHERD_AGENT_HEALTH_PORT"] = str(port)
        cluster.start_agent(extra_env=extra).port = port
    cluster.start_background(40.0)
    try:
        wait_for(cluster.all_leases_owned_by_live_agents, START_SECONDS, "every agent reading", period=0.5)
    except AssertionError:  # a loaded host: go on once every lease is read by a live agent, balanced or not
        live = {m.name for m in cluster.agents()}
        wait_for(lambda: set(cluster.lease_holders()) <= live, START_SECONDS, "every lease owned by a live agent",
                 period=0.5)
        cluster.note("unbalanced_start")
    try:  # a Spark driver holds its leases some 10 s before its query's first batch: the fault waits for the reads
        wait_for(lambda: _every_holder_read(cluster), START_SECONDS, "every holder reading its shards", period=0.5)
    except AssertionError:
        cluster.note("unread_start")
    time.sleep(2.0)


def _every_holder_read(cluster: ChaosCluster) -> bool:
    """True when every live agent holding a lease has delivered a record of each shard it holds."""
    read = {(d.shard, d.worker) for d in read_deliveries(cluster.workdir)}
    return all((key, m.name) in read for m in cluster.agents() for key in cluster.owned_by(m.name))


def _probe(run: Run, cell: Cell) -> None:
    if not cell.probe or cell.spark:
        return
    time.sleep(max(0.0, run.t0 + PROBE_DELAY - time.time()))
    holders = [m for m in run.cluster.agents() if m is not run.victim and run.cluster.owned_by(m.name)]
    if holders:
        run.probe = max(holders, key=lambda m: (len(run.cluster.owned_by(m.name)), m.name))
        run.cluster.kill(run.probe)


def _drain(cluster: ChaosCluster, log: Callable[[str], None]) -> None:
    produced = {p.data for p in cluster.producer.read()}
    try:
        wait_for(lambda: produced <= {d.data for d in read_deliveries(cluster.workdir)}, DRAIN_SECONDS,
                 "every produced record delivered", period=0.5)
    except AssertionError as exc:
        log(f"  {str(exc)[:200]}")


# ---------------------------------------------------------------------------------------------- figures
def measure(observed: Observed) -> Result:
    """Every figure of one cell from what it left behind (see the module docstring)."""
    data, t0, stopped = observed.data, observed.t0, observed.stopped
    if observed.jump and observed.victim is not None:
        data.deliveries = undo_jump(data.deliveries, observed.victim, observed.jump)
        data.checkpoints = undo_jump(data.checkpoints, observed.victim, observed.jump)
    report = analyse(data)
    counts = report.counts
    no_loss = next(c for c in report.checks if c.name == "no loss")
    produced = len(data.produced)
    delivered = {d.data for d in data.deliveries}
    lost, stranded = undelivered(data, delivered)
    covered = next(c for c in report.checks if c.name == "duplicates only after the last checkpoint")
    return Result(
        cell=observed.cell,
        read_again=read_again(data, t0, stopped),
        held_unread=held_unread(data, t0, stopped),
        moved=_moved(data, t0, observed.victim),
        probe_moved=_moved(data, t0, observed.probe),
        leader=new_leader(data, t0, observed.victim),
        healthz_red=_first_red(observed, "/healthz"),
        readyz_red=_first_red(observed, "/readyz"),
        lost=lost if produced else -1,
        stranded=stranded,
        produced=produced,
        dups=counts.get("duplicates", 0),
        dups_covered=int(covered.detail.split(",")[1].split()[0]) if not covered.ok else 0,
        late=late_writes(data, observed.victim),
        dead_threads=observed.dead_threads,
        failed_checks=[c.name for c in report.checks if not c.ok and c is not no_loss and c is not covered],
        probe_owned=_owned_elsewhere(data, t0, observed.probe),
    )


Stamped = TypeVar("Stamped", Delivery, CheckpointMark)


def undo_jump(rows: list[Stamped], worker: str, seconds: float) -> list[Stamped]:
    """`rows` with `worker`'s times after its wall clock stepped by `seconds` moved back to real time.

    Ledger lines are appended in order, so the step shows as the first pair of the worker's consecutive times that
    moved by more than half the step in its direction; every later time of that worker is shifted back.
    """
    out, previous, shifted = [], None, False
    for row in rows:
        if row.worker == worker:
            if previous is not None and not shifted and (row.time - previous) * seconds > (seconds * seconds) / 2:
                shifted = True
            previous = row.time
            if shifted:
                row = replace(row, time=row.time - seconds)
        out.append(row)
    return out


def undelivered(data: RunData, delivered: set[str]) -> tuple[int, int]:
    """(lost, stranded): undelivered records at or before their shard's last sampled checkpoint, and after it."""
    final = data.samples[-1].leases if data.samples else {}
    lost = stranded = 0
    for record in data.produced:
        if record.data in delivered:
            continue
        row = final.get(record.shard)
        done = row is not None and (row.checkpoint.is_shard_end or (
            row.checkpoint.sequence_value is not None and row.checkpoint.sequence_value >= record.sequence))
        lost, stranded = (lost + 1, stranded) if done else (lost, stranded + 1)
    return lost, stranded


def _open_shards(data: RunData, at: float) -> list[str]:
    before = [s for s in data.samples if s.time <= at]
    if not before:
        return []
    return [key for key, row in before[-1].leases.items() if not row.checkpoint.is_shard_end]


def _times(deliveries: list[Delivery]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = defaultdict(list)
    for delivery in deliveries:
        times[delivery.shard].append(delivery.time)
    for values in times.values():
        values.sort()
    return times


def read_again(data: RunData, t0: float, stopped: float) -> float | None:
    """Seconds from t0 until every shard open at t0 was read again after its stall; None if one never was.

    A stall is a gap over STALL_GAP between deliveries of a shard (t0 counts as one) that begins before the producer
    stopped; it ends at the next delivery, which may come during the drain after the stop.
    """
    times = _times(data.deliveries)
    worst = 0.0
    for shard in _open_shards(data, t0):
        points = [t0, *(t for t in times.get(shard, []) if t > t0)]
        for before, after in itertools.pairwise([*points, math.inf]):
            if before < stopped and after - before > STALL_GAP and (after < math.inf or stopped - before > STALL_GAP):
                if after == math.inf:
                    return None
                worst = max(worst, after - t0)
    return worst


def held_unread(data: RunData, t0: float, stopped: float) -> float:
    """Longest time, within [t0, stopped], that a lease was held by a worker delivering none of its records."""
    mine: dict[tuple[str, str], list[float]] = defaultdict(list)
    for delivery in data.deliveries:
        mine[(delivery.shard, delivery.worker)].append(delivery.time)
    for values in mine.values():
        values.sort()
    since: dict[str, tuple[str | None, float]] = {}  # shard -> (holder, first sample of this holding)
    worst = 0.0
    for sample in data.samples:
        for key, row in sample.leases.items():
            holder = row.checkpoint_owner or row.owner
            if holder is None or row.checkpoint.is_shard_end:
                since.pop(key, None)
                continue
            if since.get(key, (None, 0.0))[0] != holder:
                since[key] = (holder, sample.time)
            if not t0 <= sample.time <= stopped:
                continue
            delivered = [t for t in mine.get((key, holder), []) if t <= sample.time]
            start = max(since[key][1], delivered[-1] if delivered else 0.0, t0)
            worst = max(worst, sample.time - start)
    return worst


def _held_at_fault(data: RunData, t0: float, member: str | None) -> tuple[float, list[str]] | None:
    """When `member`'s fault (or kill) began and the open shards it held then; None for no such agent."""
    if member is None or not member.startswith("agent-"):
        return None
    start = next((e.time for e in data.events if e.kind == "kill" and e.target == member), t0)
    keys = [key for key in _open_shards(data, start) if _holder_before(data, key, start) == member]
    return (start, keys) if keys else None


def _moved(data: RunData, t0: float, member: str | None) -> float | None:
    """Seconds from `member`'s fault (or kill) until another worker reads every shard it held; inf if one never was.

    None when there is no such agent (the victim is a coordinator, or no probe ran).
    """
    held = _held_at_fault(data, t0, member)
    if held is None or member is None:
        return None
    start, keys = held
    by_shard: dict[str, list[Delivery]] = defaultdict(list)
    for delivery in sorted(data.deliveries, key=lambda d: d.time):
        by_shard[delivery.shard].append(delivery)
    resumed = [_resumed_elsewhere(data, by_shard, key, member, start) for key in keys]
    if any(at is None for at in resumed):
        return math.inf
    return max(at for at in resumed if at is not None) - start


def _owned_elsewhere(data: RunData, t0: float, member: str | None) -> float | None:
    """Seconds from `member`'s kill until live workers own every lease it held (the table samples); inf if never.

    Ownership, not reading: under a Kinesis blackhole nobody reads, but failover must still move the leases.
    """
    held = _held_at_fault(data, t0, member)
    if held is None:
        return None
    start, keys = held

    def moved(sample: Sample) -> bool:
        return all(sample.leases[k].owner not in (member, None) for k in keys if k in sample.leases)

    done = next((sample.time for sample in data.samples if sample.time > start and moved(sample)), None)
    return math.inf if done is None else done - start


def _holder_before(data: RunData, key: str, at: float) -> str | None:
    before = [s for s in data.samples if s.time <= at and key in s.leases]
    if not before:
        return None
    row = before[-1].leases[key]
    return row.checkpoint_owner or row.owner


def new_leader(data: RunData, t0: float, victim: str | None) -> float | None:
    """Seconds from t0 until another replica holds the lock than the victim, if the fault hit the leader; else than
    the leader at t0: a change the fault did not ask for (a leader losing its lock to a fault it should ride out)."""
    before = [s.leader for s in data.samples if s.time <= t0 and s.leader is not None]
    held = victim if victim is not None and victim.startswith("coord-") else before[-1] if before else None
    after = [s for s in data.samples if s.time > t0 and s.leader not in (None, held)]
    return after[0].time - t0 if after and held is not None else None


def _first_red(observed: Observed, path: str) -> float | None:
    """Seconds from t0 to the first of RED_POLLS failed answers in a row of `path` by a process not killed.

    One slow answer on a loaded host is not red; a probe with a failure threshold (Kubernetes) does the same. A
    process that has not answered well yet is starting, not red.
    """
    streak: dict[str, list[float]] = defaultdict(list)
    first: list[float] = []
    answered: set[str] = set()  # a process is watched from its first good answer on (not while it starts)
    for at, member, where, status in observed.health:
        if where != path or member in observed.killed:
            continue
        if status == 200:
            answered.add(member)
        if at < observed.t0 or member not in answered:
            continue
        streak[member] = [*streak[member], at] if status != 200 else []
        if len(streak[member]) == RED_POLLS:
            first.append(streak[member][0])
    return min(first) - observed.t0 if first else None


def late_writes(data: RunData, victim: str | None) -> int:
    """Deliveries by a SIGSTOPped victim after its SIGCONT of shards another worker held at that moment."""
    resumed = next((e.time for e in data.events if e.kind == "sigcont"), None)
    if resumed is None or victim is None:
        return 0
    name = victim
    return sum(1 for d in data.deliveries
               if d.worker == name and d.time > resumed and _holder_before(data, d.shard, d.time) not in (name, None))


EXCEPTION_LINE = re.compile(r"Exception in thread ([^:\s]+)")


def dead_threads(workdir: Path) -> list[str]:
    """`thread@process` for every thread that died with a traceback in a process log."""
    found = []
    for path in sorted(workdir.glob("*.log")):
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [f"{name}@{path.stem}" for name in EXCEPTION_LINE.findall(text)]
    return found


def fmt(value: float | None, missing: str = "never") -> str:
    """A figure for the table: `missing` for None, "never" for infinity."""
    if value is None:
        return missing
    return "never" if math.isinf(value) else f"{value:.1f}"


def row(result: Result) -> str:
    """One table row in Markdown."""
    dead = ", ".join(sorted(set(result.dead_threads))) or "-"
    checks = ", ".join(result.failed_checks) or "-"
    owned = "" if result.probe_owned is None else f" (owned {fmt(result.probe_owned)})"
    return (f"| {result.cell} | {fmt(result.read_again)} | {result.held_unread:.1f} | {fmt(result.moved, '-')} | "
            f"{fmt(result.probe_moved, '-')}{owned} | "
            f"{fmt(result.leader, '-')} | {fmt(result.healthz_red, '-')} / {fmt(result.readyz_red, '-')} | "
            f"{result.lost} / {result.stranded} of {result.produced} | {result.dups} ({result.dups_covered}) | "
            f"{result.late} | {dead} | {checks} |")


HEADER = ("| fault | read again s | held unread s | victim's shards moved s | probe's shards moved s (owned "
          "elsewhere) | new leader s | red s (healthz / readyz) | lost / stranded | dups (covered) | late writes | "
          "threads died | failed checks |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")
