"""The run directory of a running stack: `state.json` (endpoints, API URLs, processes) and the control socket path.

`shardherd up` writes `<run dir>/state.json` atomically whenever its processes change and removes it on a clean stop;
`shardherd scenario ...` reads it to find the stack. The default run directory is `.shardherd/up` under the current
directory (`--run-dir` or SHARDHERD_RUN_DIR override it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from shardherd.shared.errors import ShardherdError

RUN_DIR_ENV = "SHARDHERD_RUN_DIR"
DEFAULT_RUN_DIR = Path(".shardherd") / "up"
STATE_FILE = "state.json"
JOB_ENV_FILE = "job.env"  # variables of a job joining the stack as one more worker (docs/spark.md)
CONTROL_SOCKET = "control.sock"
TOKEN_FILE = "api-token"
READ_TOKEN_FILE = "api-read-token"
LOCK_FILE = "lock"
LOG_DIR = "logs"


class StackNotRunning(ShardherdError):
    """No running stack was found in the run directory."""


class RunDirInUse(ShardherdError):
    """Another `shardherd up` owns the run directory."""


class RunDirLock:
    """Exclusive ownership of a run directory: an flock on `<dir>/lock`, which holds the owner's pid.

    The kernel drops the lock when its owner dies (even by SIGKILL), so a lock left by a dead process is taken over
    without guessing from pids; the pid in the file only names the owner in the refusal. Children do not inherit it.
    """

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        self._descriptor: int | None = None

    def acquire(self) -> RunDirLock:
        """Take the lock; RunDirInUse naming the owner's pid if another live process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(descriptor, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(descriptor)
            raise RunDirInUse(f"{self.path.parent} is in use by another `shardherd up` (pid {owner}); stop it, "
                              "or pass another --run-dir") from None
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"{os.getpid()}\n".encode())
        self._descriptor = descriptor
        return self

    def release(self) -> None:
        """Give the directory up (idempotent); the file stays, empty of meaning once unlocked."""
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(descriptor, 0)
            os.close(descriptor)


def rotate(path: Path) -> Path:
    """A fresh, empty directory `path` for this run; the previous run's moves to `<path>.previous` (older ones go).

    Logs and outputs of one run never mix with another's, and the last run's stay readable after a restart.
    """
    previous = path.with_name(path.name + ".previous")
    if path.is_dir() and any(path.iterdir()):
        shutil.rmtree(previous, ignore_errors=True)
        path.rename(previous)
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_dir(explicit: str | None) -> Path:
    """The run directory: `explicit`, else $SHARDHERD_RUN_DIR, else `.shardherd/up`."""
    return Path(explicit or os.environ.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR).resolve()


@dataclass
class ProcessEntry:
    """One child process of the stack."""

    name: str
    role: str  # "agent", "coordinator", "dynamodb-emulator" or "kinesis-emulator"
    pid: int
    api_url: str | None = None
    port: int | None = None


@dataclass
class StackState:
    """What scenario commands need to act on a running stack."""

    supervisor_pid: int
    application_name: str
    stream_name: str
    region: str
    kinesis_endpoint_url: str | None
    dynamodb_endpoint_url: str | None
    dashboard_url: str
    control_socket: str
    api_token_file: str | None
    processes: list[ProcessEntry] = field(default_factory=list)
    spark: bool = False  # agents are Spark drivers (no poison handling: docs/spark.md)
    poison_policy: str = "block"  # the agents' poison_policy (decision 0031)
    poison_destination: str | None = None  # their poison_destination under quarantine

    def api_urls(self) -> list[str]:
        """Every coordinator replica's API base URL."""
        return [entry.api_url for entry in self.processes if entry.api_url is not None]

    def api_token(self) -> str | None:
        """The token the operator API's mutating endpoints want, if the stack set one."""
        if self.api_token_file is None:
            return None
        return Path(self.api_token_file).read_text(encoding="utf-8").strip()

    def by_role(self, role: str) -> list[ProcessEntry]:
        """The processes with `role`, in start order."""
        return [entry for entry in self.processes if entry.role == role]

    def write(self, directory: Path) -> None:
        """Replace `<directory>/state.json` atomically."""
        temporary = directory / (STATE_FILE + ".tmp")
        temporary.write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")
        temporary.replace(directory / STATE_FILE)

    @classmethod
    def read(cls, directory: Path) -> StackState:
        """The state of the stack running in `directory`; StackNotRunning if there is none or its owner died."""
        path = directory / STATE_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise StackNotRunning(f"no running stack in {directory} (start one with `shardherd up`)") from exc
        except ValueError as exc:
            raise StackNotRunning(f"{path} is not valid JSON: {exc}") from exc
        processes = [ProcessEntry(**entry) for entry in raw.pop("processes")]
        state = cls(**raw, processes=processes)
        if not pid_alive(state.supervisor_pid):
            raise StackNotRunning(f"the stack in {directory} is gone (process {state.supervisor_pid} is not running)")
        return state


def pid_alive(pid: int) -> bool:
    """True if a process with `pid` exists (zombies included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
