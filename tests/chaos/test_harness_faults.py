"""The fault harness's own machinery, on real processes: EROFS from the kernel through strace, and restarts."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from tests.chaos.cluster import ChaosCluster
from tests.chaos.matrix import detach, erofs_tracers
from tests.support.waiting import wait_for

# Commits a row every 20 ms to a WAL SQLite file (the store's settings) and prints each outcome as it happens.
WRITER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=WAL"); db.execute("PRAGMA synchronous=NORMAL")
db.execute("CREATE TABLE IF NOT EXISTS t (a)")
while True:
    try:
        db.execute("BEGIN IMMEDIATE"); db.execute("INSERT INTO t VALUES (1)"); db.execute("COMMIT")
        print("ok", flush=True)
    except sqlite3.Error as exc:
        print(exc.sqlite_errorname, flush=True)
    time.sleep(0.02)
"""


def test_erofs_tracers_fail_a_processs_sqlite_writes_until_detached(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    out = tmp_path / "out.txt"
    with open(out, "wb") as sink:
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=sink)
    try:
        wait_for(lambda: "ok" in out.read_text(), 10, "the writer commits")
        tracers = erofs_tracers([writer.pid], [db, Path(f"{db}-wal"), Path(f"{db}-journal")])
        seen = len(out.read_text().split())
        wait_for(lambda: "SQLITE_IOERR_WRITE" in out.read_text().split()[seen:], 10, "EROFS seen by SQLite")
        during = out.read_text().split()[seen + 1:]
        detach(tracers)
        after = len(out.read_text().split())
        wait_for(lambda: "ok" in out.read_text().split()[after:], 10, "commits again once detached")
    finally:
        writer.kill()
        writer.wait(10)
    assert during and "ok" not in during, "no commit while the tracer injects EROFS"


def test_the_restarter_starts_an_exited_member_again_and_leaves_a_killed_one(
        moto_server: MotoServer, kinesalite: NodeEmulator, tmp_path: Path) -> None:
    exits = [sys.executable, "-c", "import sys, time; time.sleep(0.3); sys.exit(3)"]
    cluster = ChaosCluster(moto_server.endpoint_url, kinesalite.endpoint_url, tmp_path, shards=1,
                           agent_command=lambda skew: exits)
    try:
        member = cluster.start_agent()
        cluster.start_restarter(first=0.2, cap=0.4)
        wait_for(lambda: member.restarts >= 2, 20, "two restarts")
        cluster.kill(member)
        restarts = member.restarts
        time.sleep(1.5)
        exited = [e.detail for e in cluster.events if e.kind == "exited"]
    finally:
        cluster.close()
    assert member.restarts == restarts, "a member the harness killed stays dead"
    assert exited[0] == "code=3; restart in 0.2 s" and exited[1].startswith("code=3")
