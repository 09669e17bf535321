"""A throwaway PostgreSQL server in a temp dir, started from the machine's binaries (initdb / pg_ctl)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from shardherd.services.emulators.ports import LOOPBACK, free_port


def _bin_dir() -> Path:
    """The directory holding initdb and pg_ctl: PATH first, then Debian's /usr/lib/postgresql/<v>/bin."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not candidates:
        raise RuntimeError("PostgreSQL binaries not found: apt-get install postgresql")
    return Path(candidates[-1]).parent


class PostgresServer:
    """initdb + pg_ctl start on a free loopback port; stop() removes everything. Runs as `postgres` when root."""

    def __init__(self) -> None:
        self.port = free_port()
        self._bin = _bin_dir()
        self._dir = Path(tempfile.mkdtemp(prefix="shardherd-pg-"))
        self._user: str | None = "postgres" if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        """SQLAlchemy URL for the psycopg 3 driver."""
        user = self._user or pwd.getpwuid(os.geteuid()).pw_name
        return f"postgresql+psycopg://{user}@{LOOPBACK}:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run([str(self._bin / args[0]), *args[1:]], check=True, user=self._user,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def start(self) -> PostgresServer:
        """Create a cluster with trust auth on loopback only and start it."""
        if self._user:
            pw = pwd.getpwnam(self._user)
            os.chown(self._dir, pw.pw_uid, pw.pw_gid)
        data = str(self._dir / "data")
        self._run("initdb", "-D", data, "-A", "trust", "-E", "UTF8", "--no-sync")
        options = (f"-c listen_addresses={LOOPBACK} -p {self.port} -k {self._dir} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run("pg_ctl", "-D", data, "-o", options, "-w", "-t", "60", "-l", str(self._dir / "log"), "start")
        return self

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while it runs (its first line of postmaster.pid), else None."""
        try:
            return int((self._dir / "data" / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Stop the server immediately and delete its directory."""
        data = self._dir / "data"
        if (data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self._dir, ignore_errors=True)
