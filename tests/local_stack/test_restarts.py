"""Agents and coordinators that exit on their own start again after a doubling delay (services/local_stack/
restarts.py), with real child processes and an injected clock; planned exits and the emulators do not."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from shardherd.services.local_stack.restarts import FIRST_DELAY, MAX_DELAY, STEADY_RUN, Restarts
from shardherd.services.local_stack.supervisor import Child, Supervisor
from shardherd.shared.clock import ManualClock
from tests.support.waiting import wait_for

EXITS = 3


def start(supervisor: Supervisor, tmp_path: Path, name: str, role: str, code: str) -> Child:
    return supervisor.spawn(name, role, "tests.local_stack.exit_child", [str(tmp_path), code], dict(os.environ),
                            grace=5.0)


def make(tmp_path: Path) -> tuple[ManualClock, Supervisor, Restarts]:
    (tmp_path / "logs").mkdir()
    clock = ManualClock()
    supervisor = Supervisor(tmp_path / "logs", clock)
    return clock, supervisor, Restarts(supervisor, ("agent", "coordinator"))


def exit_of(supervisor: Supervisor, child: Child) -> Child:
    assert child.process.wait(30) == EXITS, child.log_path.read_text()
    [exited] = supervisor.unexpected_exits()
    assert exited is child
    return exited


def test_an_agent_that_keeps_exiting_starts_again_after_a_doubling_delay_that_resets_once_it_ran(
        tmp_path: Path) -> None:
    clock, supervisor, restarts = make(tmp_path)
    child = start(supervisor, tmp_path, "agent-1", "agent", str(EXITS))
    delays = []
    for _ in range(7):
        pending = restarts.exited(exit_of(supervisor, child))
        assert pending is not None
        delays.append(pending.delay)
        clock.advance(pending.delay - 0.1)
        assert restarts.start_due() == []  # not before its delay
        clock.advance(0.1)
        [again] = restarts.start_due()
        assert (again.name, again.role, again.log_path, again.launch) == (child.name, child.role, child.log_path,
                                                                            child.launch)
        assert again.pid != child.pid
        child = again
    assert delays == [FIRST_DELAY, 2.0, 4.0, 8.0, 16.0, MAX_DELAY, MAX_DELAY]
    clock.advance(STEADY_RUN)  # it ran a minute before exiting: no longer a crash loop
    pending = restarts.exited(exit_of(supervisor, child))
    assert pending is not None and pending.delay == FIRST_DELAY
    starts = (tmp_path / "starts").read_text(encoding="utf-8").split()
    assert len(starts) == len(set(starts)) == 8  # each start a new process, logged to the same file
    assert supervisor.children() == []


def test_planned_exits_emulators_and_a_stopping_stack_start_nothing(tmp_path: Path) -> None:
    clock, supervisor, restarts = make(tmp_path)
    killed = start(supervisor, tmp_path, "agent-2", "agent", "wait")
    wait_for(lambda: (tmp_path / "starts").exists(), 30, "the child to start")
    supervisor.kill("agent-2", signal.SIGKILL)  # a scenario's kill: on purpose
    assert killed.process.wait(30) == -signal.SIGKILL
    assert restarts.exited(killed) is None
    emulator = start(supervisor, tmp_path, "moto", "moto", str(EXITS))
    assert restarts.exited(exit_of(supervisor, emulator)) is None  # not a role it was given
    coordinator = start(supervisor, tmp_path, "coordinator-1", "coordinator", str(EXITS))
    assert restarts.exited(exit_of(supervisor, coordinator)) is not None
    restarts.close()  # the stack stops: what was scheduled is dropped, and nothing more is scheduled
    clock.advance(MAX_DELAY)
    assert restarts.start_due() == []
    agent = start(supervisor, tmp_path, "agent-3", "agent", str(EXITS))
    assert restarts.exited(exit_of(supervisor, agent)) is None
    assert len((tmp_path / "starts").read_text(encoding="utf-8").split()) == 4
