"""`shardherd multilang` against the Java MultiLangDaemon (kclpy-ext's KCL 3.1.3), side by side in one run.

Both run the same amazon_kclpy processor (bench/multilang_processor.py: each batch appended to a ledger file, then a
checkpoint at its last record) from the same properties file (tests/support/kcl_worker.py's, with `maxRecords` 1000,
whose JVM options are the interop tests' small heap: -Xmx384m, SerialGC), on a fresh 8-shard stream each, on the same
emulators; only `kinesisEndpoint` differs (the JVM reaches kinesalite through the h2c proxy). shardherd runs with its
own defaults for everything the properties file does not set. Per side:
* start to first record processed: from launching the process to the first ledger line;
* resident memory of the process tree (daemon + 8 children) and of the daemon alone, peaks while it drains;
* records/s at saturation: a backlog of `--records` produced before the start, counted from the moment every shard
  has delivered its first record to the last record.
Then kill -9 of one of two `shardherd multilang` workers (properties without timings: default failover 10 s) under a
steady load: seconds until each of its shards is processed by the other worker (target < 15).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from shardherd.services.emulators.h2c_proxy import H2cProxy
from shardherd.services.emulators.kinesalite import Kinesalite
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from tests.kcl.ledger_processor import WORKER_ENV
from tests.support.file_ledger import LEDGER_ENV, read_ledger
from tests.support.kcl_worker import KclWorker
from tests.support.waiting import wait_for

REPOSITORY = Path(__file__).resolve().parents[1]
SHARDS = 8
PROCESSOR = REPOSITORY / "bench" / "multilang_processor.py"
PROPERTIES = {"executableName": f"{sys.executable} {PROCESSOR}", "maxRecords": "1000"}


class Stream:
    """A fresh stream (and application name) on kinesalite with a producer."""

    def __init__(self, kinesis_url: str, name: str, shards: int = SHARDS) -> None:
        self.name = name
        self.client = make_client("kinesis", "us-east-1", kinesis_url)
        self.client.create_stream(StreamName=name, ShardCount=shards)
        wait_for(lambda: self.client.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"][
            "StreamStatus"] == "ACTIVE", 60, "stream ACTIVE")

    def produce(self, count: int, prefix: str) -> None:
        """Put `count` small records spread over the shards."""
        for start in range(0, count, 500):
            batch = [f"{prefix}-{index}" for index in range(start, min(count, start + 500))]
            self.client.put_records(StreamName=self.name, Records=[
                {"Data": data.encode(), "PartitionKey": data} for data in batch])

    @contextlib.contextmanager
    def steady(self, per_second: int = 200) -> Iterator[None]:
        """Produce about `per_second` records a second until the block ends."""
        stop = threading.Event()

        def run() -> None:
            batch = 0
            while not stop.wait(0.5):
                self.produce(per_second // 2, f"s{batch}")
                batch += 1

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(10)


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total


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
    """Launch (start() returns the pid), then the start-to-first-record, peak tree RSS and backlog records/s."""
    launched = time.time()
    pid = start()
    peak = alone = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        peak = max(peak, tree_rss(pid))
        with contextlib.suppress(psutil.NoSuchProcess):
            alone = max(alone, psutil.Process(pid).memory_info().rss)
        if len(read_ledger(str(ledger))) >= records:
            break
        time.sleep(0.5)
    entries = read_ledger(str(ledger))
    if len(entries) < records:
        raise RuntimeError(f"only {len(entries)} of {records} records processed within {timeout} s")
    times = sorted(entry[4] for entry in entries)
    firsts: dict[str, float] = {}
    for shard, _sequence, _sub, _worker, at, _data in entries:
        firsts[shard] = min(at, firsts.get(shard, at))
    running = max(firsts.values())  # every shard has delivered its first batch
    later = [at for at in times if at > running]
    return {"first record s": times[0] - launched, "tree RSS MB": peak / 2**20, "daemon RSS MB": alone / 2**20,
            "records/s": len(later) / max(times[-1] - running, 1e-3)}


def side_by_side(moto: MotoServer, kinesalite: Kinesalite, proxy: H2cProxy, workdir: Path,
                 records: int) -> dict[str, dict[str, float]]:
    """The three figures for the Java daemon and for shardherd, each on its own fresh stream."""
    results: dict[str, dict[str, float]] = {}
    stream = Stream(kinesalite.endpoint_url, "bench-java")
    stream.produce(records, "r")
    java_ledger = workdir / "java.txt"
    kcl = KclWorker(workdir, "java", stream.name, stream.name, proxy.endpoint_url, moto.endpoint_url, java_ledger,
                    **PROPERTIES)

    def start_java() -> int:
        kcl.start()
        assert kcl._process is not None
        return kcl._process.pid

    try:
        results["Java MultiLangDaemon"] = measure(start_java, java_ledger, records, 600)
    finally:
        kcl.kill()
    stream = Stream(kinesalite.endpoint_url, "bench-shardherd")
    stream.produce(records, "r")
    daemon_properties = KclWorker(workdir, "props", stream.name, stream.name, proxy.endpoint_url,
                                  moto.endpoint_url, workdir / "unused.txt", **PROPERTIES).properties
    properties = workdir / "shardherd.properties"
    properties.write_text(shardherd_properties(daemon_properties, kinesalite.endpoint_url, "shardherd"))
    ledger = workdir / "shardherd.txt"
    processes: list[subprocess.Popen[bytes]] = []

    def start_shardherd_side() -> int:
        processes.append(start_shardherd(properties, ledger, "shardherd", workdir))
        return processes[-1].pid

    try:
        results["shardherd multilang"] = measure(start_shardherd_side, ledger, records, 600)
    finally:
        for process in processes:
            end_group(process)
    return results


def owned_by(dynamodb: Any, table: str, worker: str) -> set[str]:
    """The lease keys `worker` owns in `table` (none before the table exists)."""
    try:
        items = dynamodb.scan(TableName=table, ConsistentRead=True)["Items"]
    except dynamodb.exceptions.ResourceNotFoundException:
        return set()
    return {item["leaseKey"]["S"] for item in items if item.get("leaseOwner", {}).get("S") == worker}


def kill_failover(moto: MotoServer, kinesalite: Kinesalite, proxy: H2cProxy, workdir: Path) -> float:
    """Two shardherd multilang workers at default timings; kill -9 one; seconds until its shards are read elsewhere."""
    stream = Stream(kinesalite.endpoint_url, "bench-kill")
    daemon_properties = KclWorker(workdir, "kill-props", stream.name, stream.name, proxy.endpoint_url,
                                  moto.endpoint_url, workdir / "unused.txt", **PROPERTIES).properties
    ledger = workdir / "kill.txt"
    dynamodb = make_client("dynamodb", "us-east-1", moto.endpoint_url)
    workers: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with stream.steady():
            for name in ("ml-a", "ml-b"):
                properties = workdir / f"{name}.properties"
                properties.write_text(shardherd_properties(daemon_properties, kinesalite.endpoint_url, name,
                                                           keep_timings=False))
                workers[name] = start_shardherd(properties, ledger, name, workdir)
            wait_for(lambda: all(len(owned_by(dynamodb, stream.name, w)) >= 2 for w in workers), 180,
                     "both workers holding leases")
            time.sleep(5)
            victim = max(workers, key=lambda w: len(owned_by(dynamodb, stream.name, w)))
            shards = owned_by(dynamodb, stream.name, victim)
            killed = time.time()
            end_group(workers[victim])
            survivor = next(w for w in workers if w != victim)

            def moved() -> bool:
                seen = {shard for shard, _s, _ss, worker, at, _d in read_ledger(str(ledger))
                        if worker == survivor and at > killed}
                return shards <= seen

            wait_for(moved, 120, f"{victim}'s shards processed by {survivor}", period=0.2)
            return time.time() - killed
    finally:
        for process in workers.values():
            end_group(process)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=80_000, help="backlog drained by each side")
    parser.add_argument("--keep", type=Path, default=None, help="keep logs and ledgers in this directory")
    args = parser.parse_args(argv)
    with MotoServer() as moto, Kinesalite(shard_limit=500) as kinesalite, H2cProxy(kinesalite.port) as proxy, \
            tempfile.TemporaryDirectory() as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        results = side_by_side(moto, kinesalite, proxy, workdir, args.records)
        java, ours = results["Java MultiLangDaemon"], results["shardherd multilang"]
        print(f"\n{SHARDS} shards, backlog {args.records} records, same processor and properties")
        print(f"{'':28}{'Java daemon':>14}{'shardherd':>14}{'ratio':>10}  target")
        targets = {"first record s": "<= 0.33", "tree RSS MB": "<= 0.5", "daemon RSS MB": "", "records/s": ">= 1"}
        for key, target in targets.items():
            print(f"{key:28}{java[key]:14.1f}{ours[key]:14.1f}{ours[key] / java[key]:10.2f}  {target}", flush=True)
        seconds = kill_failover(moto, kinesalite, proxy, workdir)
        print(f"kill -9 of a shardherd multilang worker -> its shards processed elsewhere: {seconds:.1f} s "
              "(target < 15, default failover 10 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
