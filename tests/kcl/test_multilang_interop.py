"""One MultiLang application, one processor, one properties file: the Java MultiLangDaemon, then
`shardherd multilang`, then the daemon again, on the same stream and lease table.

The processor is tests/kcl/ledger_processor.py (amazon_kclpy v3) and the properties file is the one
tests/support/kcl_worker.py writes for the daemon; for shardherd only `kinesisEndpoint` (KCL reaches kinesalite through
the h2c proxy, boto3 directly) and `workerIdentifier` change. Each side stops gracefully (its processors checkpoint
on shutdownRequested), so the other side must start every shard right after that checkpoint: every record delivered,
none twice.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.kcl.harness import InteropStack, timed
from tests.kcl.ledger_processor import WORKER_ENV
from tests.kcl.test_migration import kcl_reads, resumed_exactly_after
from tests.support.kcl_worker import REPOSITORY
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.kcl, pytest.mark.slow, pytest.mark.timeout(240)]

RECORDS_PER_PHASE = 200


def shardherd_properties(stack: InteropStack, daemon_properties: str, worker: str) -> str:
    """The daemon's properties with kinesalite's own endpoint and another worker id."""
    lines = []
    for line in daemon_properties.splitlines():
        key = line.split("=", 1)[0].strip()
        if key == "kinesisEndpoint":
            line = f"kinesisEndpoint = {stack.kinesis.meta.endpoint_url}"
        elif key == "workerIdentifier":
            line = f"workerIdentifier = {worker}"
        lines.append(line)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("interop", ["worker"], indirect=True)
def test_daemon_then_shardherd_multilang_then_daemon_resume_at_each_checkpoint(interop: InteropStack) -> None:
    stack, figures = interop, dict[str, float]()

    stack.produce(RECORDS_PER_PHASE, "a")
    kcl = kcl_reads(stack, "kcl-1", "a-", figures, "daemon start to all read")
    assert kcl.stop() is not None
    after_daemon = stack.checkpoints()
    assert all(value.isdigit() for value in after_daemon.values()), after_daemon

    properties = stack.workdir / "shardherd.properties"
    properties.write_text(shardherd_properties(stack, kcl.properties.read_text(), "ml-1"))
    stack.produce(RECORDS_PER_PHASE, "b")
    started = time.monotonic()
    log = open(stack.workdir / "ml-1.log", "wb")  # noqa: SIM115 (closed below)
    process = subprocess.Popen([sys.executable, "-m", "shardherd", "multilang", "--properties", str(properties)],
                               env={**stack.env, WORKER_ENV: "ml-1", "PYTHONPATH": str(REPOSITORY)},  # as the daemon's
                               cwd=stack.workdir, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: stack.all_delivered("b-"), 60, "shardherd multilang reads the records after the daemon's")
        timed("shardherd multilang start to all read", started, figures)
        resumed_exactly_after(stack, after_daemon, "b-", "ml-1")
        process.send_signal(signal.SIGTERM)
        assert process.wait(40) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        log.close()
    after_shardherd = stack.checkpoints()
    assert all(int(after_shardherd[key]) > int(after_daemon[key]) for key in after_daemon)

    stack.produce(RECORDS_PER_PHASE, "c")
    kcl = kcl_reads(stack, "kcl-2", "c-", figures, "daemon restart to all read")
    resumed_exactly_after(stack, after_shardherd, "c-", "kcl-2")
    kcl.stop()

    counts = stack.delivered()
    print(f"daemon -> shardherd multilang -> daemon: {figures}")
    assert not set(stack.produced) - set(counts)
    assert not [data for data, count in counts.items() if count > 1]
