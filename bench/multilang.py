"""`shardherd multilang` against the Java MultiLangDaemon (kclpy-ext's KCL 3.1.3), side by side in one run.

Both run the same amazon_kclpy processor (tests/kcl/ledger_processor.py: each batch appended to a ledger file, then
a checkpoint at its last record; it imports amazon_kclpy and the standard library only) from the same properties
file (tests/support/kcl_worker.py's, with `maxRecords` 1000; the JVM gets its own defaults, as amazon_kclpy's helper
prints the command, or with --jvm-small-heap the interop tests' -Xmx384m and SerialGC), each on a fresh
8-shard stream, on the same emulators; only `kinesisEndpoint` differs (the JVM reaches kinesalite through the h2c
proxy). shardherd runs with its own defaults for everything the properties file
does not set. Per side:
* start to first record processed: from launching the process to the first ledger line;
* resident memory of the process tree (daemon + 8 children), peak while it drains: each page once (`tree_memory`: a
  file that several processes map, the children's interpreter, counted once, as a pod's memory limit counts it; the
  target), and summed over the processes as RSS (the measure before: every shared page once per process); and the
  daemon's own RSS;
* records/s at saturation: a backlog of `--records` produced before the start, counted from the moment every shard
  has delivered its first record to the last record;
* CPU seconds of the daemon and of its children (the processors), from launch to the last record: on a shared
  machine the records/s ratio moves with the other load, the CPU each side spends on the same records much less.
Then kill -9 of one of three `shardherd multilang` workers (properties without timings: default failover 10 s)
under a steady load, once one whose coordinator replica does not lead and once the leader's: seconds until each of
its shards is processed by another worker (target < 15).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from shardherd.services.emulators.h2c_proxy import H2cProxy
from shardherd.services.emulators.kinesalite import Kinesalite
from shardherd.services.emulators.moto_server import MotoServer
from tests.kcl.harness import InteropStack
from tests.kcl.ledger_processor import WORKER_ENV
from tests.support.file_ledger import LEDGER_ENV, read_ledger
from tests.support.kcl_worker import EMULATOR_JVM_OPTIONS, JVM_OPTIONS, KclWorker
from tests.support.waiting import wait_for

REPOSITORY = Path(__file__).resolve().parents[1]
SHARDS = 8
MAX_RECORDS = "1000"  # per GetRecords call, both sides


def tree_processes(pid: int) -> list[psutil.Process]:
    """A process and all its descendants (none if it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants, summed: a page that several of them map counts once per
    process (the eight children's interpreter and C libraries eight times over)."""
    total = 0
    for process in tree_processes(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total


def tree_memory(pid: int) -> int:
    """Resident bytes of a process tree with each shared file's pages counted once: every process's private pages,
    plus per file the most any process of the tree has of it shared (a lower bound where processes hold different
    parts of one file; anonymous shared pages are summed).

    This is what the tree costs a machine, or a pod's memory limit (which counts a page once), and unlike PSS it does
    not depend on what else runs: PSS divides a shared page among every process mapping it, on this shared machine
    dozens of other Python processes (and other developers' JVMs) that are no part of either side.
    """
    private = anonymous_shared = 0
    files: dict[str, int] = {}
    for process in tree_processes(pid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            for mapping in process.memory_maps(grouped=True):
                private += mapping.private_clean + mapping.private_dirty
                shared = mapping.shared_clean + mapping.shared_dirty
                if mapping.path.startswith("/"):
                    files[mapping.path] = max(files.get(mapping.path, 0), shared)
                else:
                    anonymous_shared += shared
    return private + anonymous_shared + sum(files.values())


class CpuTally:
    """CPU seconds (user + system) of a process tree: the root alone, and its descendants (children that exited keep
    their last reading)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._seen: dict[int, float] = {}

    def sample(self) -> None:
        """Read every live process of the tree."""
        try:
            root = psutil.Process(self.pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = process.cpu_times()
                self._seen[process.pid] = times.user + times.system

    @property
    def root(self) -> float:
        """The root's CPU seconds."""
        return self._seen.get(self.pid, 0.0)

    @property
    def descendants(self) -> float:
        """The descendants' CPU seconds."""
        return sum(seconds for pid, seconds in self._seen.items() if pid != self.pid)


def shardherd_properties(daemon: Path, kinesis_url: str, worker: str, keep_timings: bool = True) -> str:
    """The daemon's properties file for shardherd: kinesalite's own endpoint, another worker id (optionally no
    timings: shardherd's and KCL's defaults)."""
    from tests.support.kcl_worker import FAST_TIMINGS

    lines = []
    for line in daemon.read_text().splitlines():
        key = line.split("=", 1)[0].strip()
        if key == "kinesisEndpoint":
            line = f"kinesisEndpoint = {kinesis_url}"
        elif key == "workerIdentifier":
            line = f"workerIdentifier = {worker}"
        elif key in FAST_TIMINGS and not keep_timings:
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def start_shardherd(properties: Path, ledger: Path, worker: str, workdir: Path) -> subprocess.Popen[bytes]:
    """`shardherd multilang --properties FILE` in its own process group, API on a free port."""
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "SHARDHERD_API_PORT": "0",
           LEDGER_ENV: str(ledger), WORKER_ENV: worker, "PYTHONPATH": str(REPOSITORY)}
    with open(workdir / f"{worker}.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "shardherd", "multilang", "--properties", str(properties)],
                                env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def end_group(process: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Signal a process group and reap its leader."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(30)


def measure(start: Callable[[], int], ledger: Path, records: int, timeout: float) -> dict[str, float]:
    """Launch (start() returns the pid), then the start-to-first-record, peak tree memory (and RSS) and backlog
    records/s."""
    launched = time.time()
    pid = start()
    peak = alone = once = 0
    cpu = CpuTally(pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        summed = tree_rss(pid)
        peak = max(peak, summed)
        if summed >= 0.98 * peak:  # near its peak: reading every mapping of a JVM takes a tenth of a second
            once = max(once, tree_memory(pid))
        cpu.sample()
        with contextlib.suppress(psutil.NoSuchProcess):
            alone = max(alone, psutil.Process(pid).memory_info().rss)
        if len(read_ledger(str(ledger))) >= records:
            break
        time.sleep(0.5)
    cpu.sample()
    entries = read_ledger(str(ledger))
    if len(entries) < records:
        raise RuntimeError(f"only {len(entries)} of {records} records processed within {timeout} s")
    times = sorted(entry[4] for entry in entries)
    firsts: dict[str, float] = {}
    for shard, _sequence, _sub, _worker, at, _data in entries:
        firsts[shard] = min(at, firsts.get(shard, at))
    running = max(firsts.values())  # every shard has delivered its first batch
    later = [at for at in times if at > running]
    return {"first record s": times[0] - launched, "tree memory MB": once / 2**20, "tree RSS sum MB": peak / 2**20,
            "daemon RSS MB": alone / 2**20,
            "records/s": len(later) / max(times[-1] - running, 1e-3),
            "daemon CPU s": cpu.root, "children CPU s": cpu.descendants}


def java_side(stack: InteropStack, records: int, small_heap: bool) -> dict[str, float]:
    """The Java daemon draining `records` on its own stream (the JVM's own defaults, or the tests' small heap)."""
    stack.produce(records, "r")
    options = JVM_OPTIONS if small_heap else EMULATOR_JVM_OPTIONS
    kcl = KclWorker(stack.workdir, "java", stack.app, stack.app, stack.proxy.endpoint_url, stack.moto.endpoint_url,
                    stack.ledger, jvm_options=options, maxRecords=MAX_RECORDS)

    def start() -> int:
        kcl.start()
        assert kcl._process is not None
        return kcl._process.pid

    try:
        return measure(start, stack.ledger, records, 900)
    finally:
        kcl.kill()


def shardherd_side(stack: InteropStack, records: int, kinesis_url: str) -> dict[str, float]:
    """`shardherd multilang` draining `records` on its own stream, from the daemon's properties file."""
    stack.produce(records, "r")
    properties = stack.workdir / "shardherd.properties"
    properties.write_text(shardherd_properties(daemon_properties(stack), kinesis_url, "shardherd"))
    processes: list[subprocess.Popen[bytes]] = []

    def start() -> int:
        processes.append(start_shardherd(properties, stack.ledger, "shardherd", stack.workdir))
        return processes[-1].pid

    try:
        return measure(start, stack.ledger, records, 900)
    finally:
        for process in processes:
            end_group(process)


def daemon_properties(stack: InteropStack) -> Path:
    """The properties file the Java daemon would get for this stack's application."""
    return KclWorker(stack.workdir, "properties", stack.app, stack.app, stack.proxy.endpoint_url,
                     stack.moto.endpoint_url, stack.ledger, maxRecords=MAX_RECORDS).properties


def kill_failover(stack: InteropStack, kinesis_url: str) -> dict[str, float]:
    """Three shardherd multilang workers at default timings under a steady load; kill -9 one whose coordinator
    replica does not lead, then the one whose replica leads; seconds until the killed worker's shards are processed
    by another worker, per case."""
    workers: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str) -> None:
        properties = stack.workdir / f"{name}.properties"
        properties.write_text(shardherd_properties(daemon_properties(stack), kinesis_url, name, keep_timings=False))
        workers[name] = start_shardherd(properties, stack.ledger, name, stack.workdir)

    def owned(worker: str) -> set[str]:
        try:
            return {key for key, owner in stack.owners().items() if owner == worker}
        except stack.dynamodb.exceptions.ResourceNotFoundException:
            return set()  # no worker has created the table yet

    def kill(victim: str) -> float:
        shards = owned(victim)
        killed = time.time()
        end_group(workers.pop(victim))

        def moved() -> bool:
            seen = {shard for shard, _s, _ss, worker, at, _d in stack.entries() if worker != victim and at > killed}
            return shards <= seen

        wait_for(moved, 120, f"{victim}'s shards processed elsewhere", period=0.2)
        return time.time() - killed

    results: dict[str, float] = {}
    try:
        with stack.steady_load("s", per_second=200):
            for name in ("ml-a", "ml-b", "ml-c"):
                start(name)
            for case in ("worker whose replica does not lead", "worker whose replica leads"):

                def candidates(leads: bool = case.endswith("leads")) -> list[str]:
                    try:
                        leader = (stack.leader() or "").removesuffix("-coordinator")
                    except stack.dynamodb.exceptions.ResourceNotFoundException:
                        return []  # no replica has created the tables yet
                    return [w for w in sorted(workers) if (w == leader) == leads and owned(w)]

                wait_for(lambda: bool(candidates()), 240, f"a {case} holding leases")
                victim = candidates()[0]
                results[case] = kill(victim)
                print(f"kill -9 of a {case} ({victim}): its shards processed elsewhere after {results[case]:.1f} s",
                      flush=True)
    finally:
        for process in workers.values():
            end_group(process)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=80_000, help="backlog drained by each side")
    parser.add_argument("--keep", type=Path, default=None, help="keep logs and ledgers in this directory")
    parser.add_argument("--jvm-small-heap", action="store_true",
                        help="run the JVM with the interop tests' -Xmx384m and SerialGC instead of its own defaults "
                             "(which amazon_kclpy's helper leaves it)")
    parser.add_argument("--sides", default="java,shardherd,kill", help="which of java, shardherd, kill to run")
    args = parser.parse_args(argv)
    with MotoServer() as moto, Kinesalite(shard_limit=500) as kinesalite, H2cProxy(kinesalite.port) as proxy, \
            tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or Path(tmp)

        def stack(name: str) -> InteropStack:
            (workdir / name).mkdir(parents=True, exist_ok=True)
            return InteropStack(moto, kinesalite, proxy, workdir / name, shards=SHARDS)

        results: dict[str, dict[str, float]] = {}
        if "java" in args.sides:
            results["java"] = java_side(stack("java"), args.records, args.jvm_small_heap)
        if "shardherd" in args.sides:
            results["shardherd"] = shardherd_side(stack("shardherd"), args.records, kinesalite.endpoint_url)
        print(f"\n{SHARDS} shards, backlog {args.records} records, same processor and properties")
        print(f"{'':28}{'Java daemon':>14}{'shardherd':>14}{'ratio':>10}  target")
        targets = {"first record s": "<= 0.33", "tree memory MB": "<= 0.5", "tree RSS sum MB": "", "daemon RSS MB": "",
                   "records/s": ">= 1",
                   "daemon CPU s": "", "children CPU s": ""}
        java, ours = results.get("java", {}), results.get("shardherd", {})
        for key, target in targets.items():
            ratio = ours[key] / java[key] if key in java and key in ours else math.nan
            print(f"{key:28}{java.get(key, math.nan):14.1f}{ours.get(key, math.nan):14.1f}{ratio:10.2f}  {target}",
                  flush=True)
        if "kill" in args.sides:
            for case, seconds in kill_failover(stack("kill"), kinesalite.endpoint_url).items():
                print(f"kill -9 of a shardherd multilang {case} -> its shards processed elsewhere: {seconds:.1f} s "
                      "(target < 15, default failover 10 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
