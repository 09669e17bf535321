"""A Spark standalone cluster on 127.0.0.1 for tests: a master and workers from the installed PySpark's jars.

Each daemon is `spark-class org.apache.spark.deploy.master.Master` / `...worker.Worker` in its own process group,
bound to 127.0.0.1 (SPARK_LOCAL_IP also puts the web UIs on loopback) on ports picked free, with small heaps. Workers
start executor JVMs for the applications that connect; those run Python workers with the interpreter the driver names
(PYSPARK_PYTHON), which has shardherd installed, as the executors of the agent image do: the workers' environment
has no PYTHONPATH. Logs (daemons, and each executor's stdout/stderr in the workers' work directories) stay under the
directory given; `logs()` gathers their tails for failure messages. `stop()` kills every process the cluster started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from shardherd.services.emulators.ports import LOOPBACK, free_port, wait_until

DAEMON_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Dspark.master.rest.enabled=false"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def spark_home() -> Path:
    """The installed PySpark package folder: a Spark distribution (bin/spark-class and jars/)."""
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass
class Daemon:
    """One master or worker process and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path


def _tail(path: Path, chars: int = 2500) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-chars:] if path.exists() else ""


class StandaloneCluster:
    """A master and `workers` workers (`cores` and `memory` each) on loopback; `url` is the master's spark:// URL."""

    def __init__(self, workdir: Path, workers: int = 2, cores: int = 2, memory: str = "1g",
                 daemon_memory: str = "256m") -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://{LOOPBACK}:{self.port}"
        env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHONPATH", "SPARK_"))}
        env.update(SPARK_LOCAL_IP=LOOPBACK, SPARK_DAEMON_MEMORY=daemon_memory, SPARK_DAEMON_JAVA_OPTS=DAEMON_JVM,
                   SPARK_LOG_DIR=str(workdir), SPARK_NO_DAEMONIZE="1")
        self._env = env
        self.daemons: list[Daemon] = []
        try:
            self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port",
                        str(self.port), "--webui-port", str(self.ui_port))
            wait_until(lambda: self._state() is not None, 90, "the Spark master", self._running)
            for index in range(workers):
                work = workdir / f"worker-{index}"
                self._spawn(f"worker-{index}", "org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK,
                            "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", str(cores),
                            "--memory", memory, "--work-dir", str(work), self.url)
            wait_until(lambda: self.alive_workers() == workers, 90, f"{workers} workers registered", self._running)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, main_class: str, *args: str) -> None:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), main_class, *args],
                                       cwd=self.workdir, env=self._env, stdout=sink, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.daemons.append(Daemon(name, process, log))

    def _running(self) -> bool:
        return all(daemon.process.poll() is None for daemon in self.daemons)

    def _state(self) -> dict[str, object] | None:
        """The master's JSON status page (workers, applications), or None while it does not answer with JSON yet."""
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{self.ui_port}/json/", timeout=2) as response:
                state: dict[str, object] = json.load(response)
                return state
        except (OSError, ValueError):  # not listening yet, or its web UI is up before the JSON page is
            return None

    def alive_workers(self) -> int:
        """How many workers the master counts as alive."""
        state = self._state()
        return int(str(state.get("aliveworkers", 0))) if state else 0

    def worker_pids(self) -> set[int]:
        """Pids of the worker daemons (the JVMs: spark-class execs java)."""
        return {daemon.process.pid for daemon in self.daemons if daemon.name.startswith("worker")}

    def app_ids(self, name: str) -> set[str]:
        """Ids of the running applications called `name` (the SparkSession's app name)."""
        state = self._state() or {}
        apps = state.get("activeapps", [])
        return {str(app["id"]) for app in apps if app.get("name") == name} if isinstance(apps, list) else set()

    def executors(self, app_id: str | None = None) -> list[psutil.Process]:
        """The executor JVMs running now (children of the workers), all or those of application `app_id`."""
        found: list[psutil.Process] = []
        for pid in self.worker_pids():
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(pid).children():
                    with contextlib.suppress(psutil.Error):  # a short-lived child that is gone by now
                        command = child.cmdline()
                        if EXECUTOR_CLASS in command and (app_id is None or app_id in command):
                            found.append(child)
        return found

    def executor_of(self, pid: int) -> psutil.Process | None:
        """The executor JVM that process `pid` (e.g. a Python worker) runs under, if any."""
        try:
            for ancestor in psutil.Process(pid).parents():
                if EXECUTOR_CLASS in " ".join(ancestor.cmdline()):
                    return ancestor
        except psutil.Error:
            return None
        return None

    def logs(self) -> str:
        """The tail of every daemon's and executor's log, for a failure message."""
        parts = [f"--- {daemon.name} ({daemon.log})\n{_tail(daemon.log)}" for daemon in self.daemons]
        parts += [f"--- {path}\n{_tail(path)}" for path in sorted(self.workdir.glob("worker-*/app-*/*/stderr"))]
        return "\n".join(parts)

    def stop(self) -> None:
        """Kill the workers (with their executors and Python workers) and the master, and reap them."""
        for daemon in reversed(self.daemons):
            processes: list[psutil.Process] = []
            with contextlib.suppress(psutil.Error):
                processes = psutil.Process(daemon.process.pid).children(recursive=True)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(daemon.process.pid, signal.SIGKILL)
            for process in processes:  # an executor's orphans left its group only if they made their own
                try:
                    process.kill()
                except psutil.Error:
                    continue
            daemon.process.wait(30)
