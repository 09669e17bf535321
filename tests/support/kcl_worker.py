"""Runs the real Java KCL 3.x MultiLangDaemon (jars from the pinned `kclpy-ext` wheel) as a child process.

Each worker gets its own directory holding its properties file, a logback configuration and its log. Settings that
make KCL work against the test emulators: Kinesis through the h2c proxy (services/emulators/h2c_proxy.py), CBOR off
(`-Daws.cborEnabled=false`, else large GetRecords answers arrive truncated), no EC2 metadata probe, polling retrieval,
no CloudWatch metrics, and `shutdownGraceMillis` so SIGTERM shuts the scheduler down gracefully (processors are asked
to checkpoint and leases are released). Timings are short so a test runs in seconds, not minutes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

import amazon_kclpy

from tests.kcl.ledger_processor import WORKER_ENV
from tests.support.file_ledger import LEDGER_ENV

REPOSITORY = Path(__file__).resolve().parents[2]
PROCESSOR = REPOSITORY / "tests" / "kcl" / "ledger_processor.py"
JARS_DIR = Path(amazon_kclpy.__file__).resolve().parent / "jars"
DAEMON_CLASS = "software.amazon.kinesis.multilang.MultiLangDaemon"
EMULATOR_JVM_OPTIONS = ("-Daws.cborEnabled=false", "-Daws.disableEc2Metadata=true")  # needed on the emulators
JVM_OPTIONS = ("-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k",
               *EMULATOR_JVM_OPTIONS)
# KCL's timings for tests (KCL defaults in brackets): a lease expires after 3 s [10 s], the leader assigns every
# 2 s [20 s] and workers discover new leases every ~1 s [10 s]; metrics are reported every 2 s [30 s], so a worker
# row goes stale 4 s after its worker died [60 s].
FAST_TIMINGS: dict[str, str] = {
    "failoverTimeMillis": "3000",
    "leaseAssignmentIntervalMillis": "2000",
    "shardSyncIntervalMillis": "5000",
    "parentShardPollIntervalMillis": "1000",
    "idleTimeBetweenReadsInMillis": "200",
    "shutdownGraceMillis": "8000",
    "gracefulLeaseHandoffTimeoutMillis": "3000",
    "inMemoryWorkerMetricsCaptureFrequencyMillis": "500",
    "workerMetricsReporterFreqInMillis": "2000",
    "taskBackoffTimeMillis": "200",
    "skipShardSyncAtWorkerInitializationIfLeasesExist": "true",
}
_LOGBACK = """<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file>
    <encoder><pattern>%d{{HH:mm:ss.SSS}} %-5level %logger{{36}} - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
"""


class KclWorker:
    """One MultiLangDaemon process (plus its per-shard Python processors) in its own process group."""

    def __init__(self, workdir: Path, worker_id: str, application: str, stream: str, kinesis_url: str,
                 dynamodb_url: str, ledger: Path, jvm_options: tuple[str, ...] = JVM_OPTIONS,
                 **properties: str) -> None:
        self.jvm_options = jvm_options
        self.worker_id = worker_id
        self.dir = (workdir / worker_id).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ledger = ledger.resolve()
        self.log = self.dir / "kcl.log"
        settings = {
            "executableName": f"{sys.executable} {PROCESSOR}",
            "applicationName": application,
            "streamName": stream,
            "workerIdentifier": worker_id,
            "regionName": "us-east-1",
            "kinesisEndpoint": kinesis_url,
            "dynamoDBEndpoint": dynamodb_url,
            "AWSCredentialsProvider": "DefaultCredentialsProvider",
            "processingLanguage": f"python/{sys.version_info.major}.{sys.version_info.minor}",
            "initialPositionInStream": "TRIM_HORIZON",
            "retrievalMode": "POLLING",
            "metricsLevel": "NONE",
            **FAST_TIMINGS,
            **properties,
        }
        self.properties = self.dir / "kcl.properties"
        self.properties.write_text("".join(f"{key} = {value}\n" for key, value in settings.items()), encoding="utf-8")
        (self.dir / "logback.xml").write_text(_LOGBACK.format(log=self.log), encoding="utf-8")
        self._process: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None

    @property
    def running(self) -> bool:
        """True while the daemon's JVM is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> KclWorker:
        """Start the daemon; it creates KCL's tables and leases itself when they do not exist."""
        java = shutil.which("java")
        assert java is not None, "Java 17 is needed for the KCL interop tests (scripts/test.sh installs it)"
        classpath = ":".join([*sorted(str(jar) for jar in JARS_DIR.glob("*.jar")), str(self.dir)])
        self._output = open(self.dir / "daemon.out", "ab")  # noqa: SIM115 (closed by the stop methods)
        self._process = subprocess.Popen(
            [java, *self.jvm_options, "-cp", classpath, DAEMON_CLASS, "--properties-file", str(self.properties),
             "--log-configuration", str(self.dir / "logback.xml")],
            env={**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1",
                 LEDGER_ENV: str(self.ledger), WORKER_ENV: self.worker_id, "PYTHONPATH": str(REPOSITORY)},
            cwd=self.dir, stdin=subprocess.DEVNULL, stdout=self._output, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM the JVM (KCL's graceful shutdown: processors checkpoint, leases are released); its exit code."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout)
        code = process.poll()
        self._end_group()
        return code

    def kill(self) -> None:
        """SIGKILL the whole process group (the JVM and its processors): a host dying, no shutdown at all."""
        self._end_group()

    def log_tail(self, lines: int = 40) -> str:
        """The end of KCL's log, for assertion messages."""
        try:
            return "\n".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no KCL log)"

    def _end_group(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        if self._output is not None:
            self._output.close()
            self._output = None
