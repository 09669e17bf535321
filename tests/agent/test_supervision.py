"""Supervision (decision 0022): the Supervisor's rules, and the agent-side threads that used to die or stall silently.

Real threads and the system clock at sub-second intervals; the store and Kinesis are the emulators over HTTP, with
faults from the proxies. Each test names the issue-30 bug it covers.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from py4j.protocol import Py4JNetworkError

from shardherd.agent.lease_keeper import LeaseKeeper, LossReason
from shardherd.agent.read_spec import StartPosition
from shardherd.agent.spark.driver import SPARK_SUPERVISOR, SparkAgent
from shardherd.agent.spark.kinesis_raw import RawKinesis
from shardherd.agent.spark.probe import Prober
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import TRIM_HORIZON
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings
from shardherd.shared.lease import Lease, new_lease
from shardherd.shared.store import LeaseStore
from shardherd.shared.supervision import EXIT_GAVE_UP, Kind, Supervisor
from tests.support.chaos_proxy import Chaos, ChaosProxy
from tests.support.faulty_proxy import Fault, FaultyProxy
from tests.support.stores import make_store, unique_app, worker_record
from tests.support.stream_stack import active_stream
from tests.support.waiting import wait_for

KEY = "shardId-000000000000"


class Recorder:
    """Stands in for os._exit and for letting go: records what the supervisor did."""

    def __init__(self) -> None:
        self.exits: list[int] = []
        self.let_go: list[str] = []

    def exit(self, code: int) -> None:
        self.exits.append(code)

    def give_up(self, why: str) -> None:
        self.let_go.append(why)


def test_a_restartable_loop_is_restarted_with_growing_backoff_and_counted() -> None:
    failures: list[float] = []
    stop = threading.Event()

    def step() -> None:
        if len(failures) < 4:
            failures.append(time.monotonic())
            raise OSError("injected")

    recorder = Recorder()
    supervisor = Supervisor(give_up=recorder.give_up, exit=recorder.exit)
    supervisor.loop("worker", step, 0.05, Kind.RESTARTABLE, stop=stop)
    wait_for(lambda: len(failures) == 4, 5, "four failures")
    gaps = [later - earlier for earlier, later in itertools.pairwise(failures)]
    assert gaps[1] > gaps[0] * 1.5 and gaps[2] > gaps[1] * 1.5  # 0.1, 0.2, 0.4 s: measured from each end
    wait_for(lambda: supervisor.snapshot()[0].restarts == 4, 2, "restarts counted")
    state = supervisor.snapshot()[0]
    assert state.last_error == "OSError: injected" and not state.stalled
    assert supervisor.problem() is None and recorder.exits == []  # restartable: the process carries on
    stop.set()


def test_a_critical_loop_that_raises_lets_go_and_exits_once() -> None:
    recorder = Recorder()
    supervisor = Supervisor(give_up=recorder.give_up, exit=recorder.exit)

    def step() -> None:
        raise RuntimeError("injected")

    for name in ("a", "b"):
        supervisor.loop(name, step, 0.05, Kind.CRITICAL)
    wait_for(lambda: bool(recorder.exits), 2, "the exit")
    time.sleep(0.2)
    assert recorder.exits == [EXIT_GAVE_UP] and len(recorder.let_go) == 1  # once, whichever thread came first
    assert "failed: RuntimeError: injected" in (supervisor.problem() or "")


def test_a_critical_loop_without_progress_fails_health_within_its_bound_and_gives_up() -> None:
    recorder = Recorder()
    supervisor = Supervisor(give_up=recorder.give_up, exit=recorder.exit, give_up_floor=0.0)
    release = threading.Event()
    supervisor.loop("stuck", lambda: release.wait(10), 0.1, Kind.CRITICAL, stall_after=0.3)
    supervisor.watch()
    started = time.monotonic()
    wait_for(lambda: supervisor.problem() is not None, 2, "health red")
    assert time.monotonic() - started < 0.3 + 0.3  # the bound plus the watchdog's period and slack
    wait_for(lambda: bool(recorder.exits), 2, "the exit")
    assert "stuck made no progress" in recorder.let_go[0]
    release.set()
    supervisor.stop()


class FailsOnce:
    """A listener whose first `lease_acquired` raises (a failed channel write; no thread left under a pids limit)."""

    def __init__(self) -> None:
        self.acquired: list[str] = []
        self.calls = 0

    def lease_acquired(self, lease: Lease) -> None:
        self.calls += 1
        if self.calls == 1:
            raise OSError(28, "No space left on device")
        self.acquired.append(lease.lease_key)

    def handoff_requested(self, lease: Lease) -> None:
        """Not used here."""

    def lease_lost(self, lease_key: str, reason: LossReason) -> None:
        """Not used here."""

    def leases_awaited(self, lease_keys: frozenset[str]) -> None:
        """Not used here."""


def test_a_lease_whose_start_fails_is_not_held_and_is_offered_again(store: LeaseStore) -> None:
    """Bug 4: the lease was stored as held before `lease_acquired`; one failure left it held and never read."""
    clock = ManualClock()
    listener = FailsOnce()
    keeper = LeaseKeeper(store, load_settings(worker_id="w1", application_name="fails-once"), clock, listener)
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    store.assign(KEY, "w1", None, None)
    for _ in range(2):  # heartbeat, discovery: the start fails
        clock.advance(0.5)
        keeper.tick()
    assert listener.calls == 1 and keeper.held() == {}  # not held while nothing processes it
    for _ in range(4):  # the next discovery offers it again
        clock.advance(0.5)
        keeper.tick()
    assert listener.acquired == [KEY] and set(keeper.held()) == {KEY}


class Garbage(Fault):
    """A 200 whose body is not JSON (a proxy's page)."""

    def body(self) -> bytes:
        return b"<html>captive portal</html>"


def test_a_probe_that_meets_a_non_json_answer_is_a_failed_probe_not_a_dead_thread(kinesalite: NodeEmulator) -> None:
    """Bug 3: Prober.probe caught only ShardReadError, so this killed the driver's probing thread."""
    kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
    stream = unique_app("garbage")
    active_stream(kinesis, stream, 1)
    kinesis.put_record(StreamName=stream, Data=b"one", PartitionKey="k")
    with FaultyProxy(kinesalite.endpoint_url, [Garbage(200)] * 2) as proxy:  # the client's every attempt
        prober = Prober(RawKinesis("us-east-1", proxy.endpoint_url, attempts=2), stream)
        start = StartPosition.after(TRIM_HORIZON)
        failed = prober.probe(KEY, start, None)
        assert failed.failed and not failed.pending and not failed.ended and proxy.faults_served == 2
        probed = prober.probe(KEY, start, None)  # the next round works again
        assert probed.pending and not probed.failed


class DeadJvmQuery:
    """A StreamingQuery whose JVM is gone: every call over py4j fails as it does then."""

    @property
    def isActive(self) -> bool:  # noqa: N802 (PySpark's name)
        raise Py4JNetworkError("Answer from Java side is empty")

    def exception(self) -> Any:
        raise Py4JNetworkError("Answer from Java side is empty")

    def stop(self) -> None:
        raise Py4JNetworkError("Answer from Java side is empty")


@pytest.mark.slow
def test_a_driver_whose_jvm_died_gives_its_leases_back_and_exits(moto_server: MotoServer, kinesalite: NodeEmulator,
                                                                  tmp_path: Path) -> None:
    """Bug 5: the supervisor thread died on the py4j error; the agent kept heartbeating and holding its leases."""
    stream = unique_app("dead-jvm")
    settings = load_settings(worker_id="w1", application_name=stream, stream_name=stream,
                             kinesis_endpoint_url=kinesalite.endpoint_url, disable_worker_metrics=True,
                             failover_time_millis=2000, discovery_interval_millis=200, agent_health_port=0)
    store = make_store("dynamodb", moto_url=moto_server.endpoint_url)
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    store.assign(KEY, "w1", None, None)
    exits: list[int] = []
    agent = SparkAgent(settings, channel=tmp_path, store=store, exit=exits.append).start()
    try:
        wait_for(lambda: KEY in agent.keeper.held(), 10, "w1 holds the lease")
        assert agent.health is not None
        agent.supervise(DeadJvmQuery())  # type: ignore[arg-type]
        wait_for(lambda: bool(exits), 5, "the driver to give up")
        assert exits == [EXIT_GAVE_UP] and SPARK_SUPERVISOR in (agent.supervisor.gave_up or "")
        lease = store.get_lease(KEY)
        assert lease is not None and lease.lease_owner is None  # given back: no failover time lost
        beat = worker_record(store, "w1")
        time.sleep(1.0)
        assert worker_record(store, "w1") == beat  # no heartbeat after giving up
        answer = httpx.get(f"http://127.0.0.1:{agent.health.port}/healthz", timeout=5)
        assert answer.status_code == 503 and "Py4JNetworkError" in answer.json()["detail"]
    finally:
        agent.stop(drain=False)
        store.close()


@pytest.mark.slow
def test_a_driver_whose_reads_fail_for_good_gives_its_lease_back_and_says_so(
        moto_server: MotoServer, kinesalite: NodeEmulator, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 30: a Spark prober whose reads fail for good (here ExpiredToken) kept its leases.

    While the reads answer, the lease is kept well past the give-up bound; once every read fails it is given back at
    red (3 heartbeat intervals): its reads only fail, a fault of this worker's (agent/stall_watch.py, invariant 3; 2
    failover times after red in session 21, 3 before). About 14 s: the lease must be seen kept past the give-up
    bound (8.3 s at a 2 s failover) and then given back at the failing bound (2.3 s), once, the log saying why.
    """
    stream = unique_app("failing-reads")
    kinesis = make_client("kinesis", "us-east-1", kinesalite.endpoint_url)
    active_stream(kinesis, stream, 1)
    with ChaosProxy(kinesalite.endpoint_url) as proxy:
        settings = load_settings(worker_id="w1", application_name=stream, stream_name=stream,
                                 kinesis_endpoint_url=proxy.endpoint_url, disable_worker_metrics=True,
                                 failover_time_millis=2000, discovery_interval_millis=200, agent_health_port=0)
        store = make_store("dynamodb", moto_url=moto_server.endpoint_url)
        store.create_lease(new_lease(KEY, TRIM_HORIZON))
        store.assign(KEY, "w1", None, None)
        agent = SparkAgent(settings, channel=tmp_path, store=store).start()
        try:
            wait_for(lambda: KEY in agent.keeper.held(), 10, "w1 holds the lease")
            assert agent.health is not None
            bounds = agent.stalls.bounds
            time.sleep(bounds.give_up_after + 1.0)  # probes answer: progress, so the lease stays
            assert KEY in agent.keeper.held() and agent.stalls.given_up == 0
            proxy.set(Chaos(reply=Fault(400, "ExpiredTokenException")))
            failing = time.monotonic()
            url = f"http://127.0.0.1:{agent.health.port}"
            with caplog.at_level(logging.ERROR, logger="shardherd.agent.stall_watch"):
                wait_for(lambda: agent.stalls.given_up == 1, bounds.give_up_after + 2, "the lease given back")
            given = time.monotonic() - failing
            print(f"\nreads failing: lease given back after {given:.2f} s (bound {bounds.red_after:.1f} s)")
            assert bounds.red_after - 0.5 <= given <= bounds.red_after + 1.5
            assert any(KEY in record.getMessage() and "ExpiredTokenException" in record.getMessage()
                       for record in caplog.records)
            lease = store.get_lease(KEY)
            assert lease is not None and lease.lease_owner != "w1"
            assert "shardherd_leases_given_up_total 1.0" in httpx.get(f"{url}/metrics", timeout=5).text
        finally:
            proxy.set(Chaos())
            agent.stop(drain=False)
            store.close()
