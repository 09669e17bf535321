"""The AWS emulators of the stack, on 127.0.0.1: moto server for DynamoDB, kinesalite for Kinesis.

Each is started only when nothing else is configured: an endpoint URL in the settings, `--aws` (real AWS through the
standard boto3 credential chain) or the SQL store backend (no DynamoDB needed) means that emulator is not started.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from shardherd.services.emulators.kinesalite import Kinesalite
from shardherd.services.emulators.ports import LOOPBACK, free_port, port_open, wait_until
from shardherd.services.local_stack.state import ProcessEntry
from shardherd.services.local_stack.supervisor import Child, Supervisor, log_tail
from shardherd.shared.config import Settings
from shardherd.shared.errors import ShardherdError

DYNAMODB_EMULATOR = "dynamodb-emulator"
KINESIS_EMULATOR = "kinesis-emulator"
STARTUP_TIMEOUT = 60.0


class EmulatorFailed(ShardherdError, RuntimeError):
    """An emulator did not come up."""


@dataclass(frozen=True)
class Endpoints:
    """Endpoint URLs for boto3 (None: the real AWS endpoint of the region)."""

    dynamodb: str | None
    kinesis: str | None


class Emulators:
    """Starts the emulators the configuration lacks, and stops them."""

    def __init__(self, settings: Settings, supervisor: Supervisor, use_aws: bool) -> None:
        self._settings = settings
        self._supervisor = supervisor
        self._use_aws = use_aws
        self.moto: Child | None = None
        self.kinesalite: Kinesalite | None = None
        self._kinesis_exit_reported = False

    def start(self) -> Endpoints:
        """Start what is needed (moto in the background while kinesalite starts) and wait until both answer."""
        settings = self._settings
        dynamodb, kinesis = settings.dynamodb_endpoint_url, settings.kinesis_endpoint_url
        if not self._use_aws and dynamodb is None and settings.store_backend == "dynamodb":
            port = free_port()
            env = {**os.environ, "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}
            self.moto = self._supervisor.spawn("moto", DYNAMODB_EMULATOR, "shardherd.services.emulators.serial_moto",
                                               ["-H", LOOPBACK, "-p", str(port)], env, grace=5.0, port=port)
            dynamodb = f"http://{LOOPBACK}:{port}"
        if not self._use_aws and kinesis is None:
            self.kinesalite = Kinesalite(startup_timeout=STARTUP_TIMEOUT,
                                         log_path=self._supervisor.log_dir / "kinesalite.log").start()
            kinesis = self.kinesalite.endpoint_url
        if self.moto is not None:
            moto = self.moto
            try:
                wait_until(lambda: port_open(moto.port or 0), STARTUP_TIMEOUT, "moto server", lambda: moto.alive)
            except RuntimeError as exc:
                raise EmulatorFailed(f"{exc}; its log ends with:\n{log_tail(moto.log_path)}") from exc
        return Endpoints(dynamodb, kinesis)

    def kinesis_exit(self) -> str | None:
        """A line saying kinesalite exited by itself (its status and log), once; None while it runs.

        Not a supervised child (it is stopped with its process group), so the stack asks here on each status tick.
        """
        emulator = self.kinesalite
        if emulator is None or self._kinesis_exit_reported or (code := emulator.exit_code) is None:
            return None
        self._kinesis_exit_reported = True
        return f"kinesalite exited on its own (code {code}); log: {emulator.log_path}"

    def entries(self) -> list[ProcessEntry]:
        """The emulator processes, for the state file."""
        found = []
        if self.moto is not None:
            found.append(ProcessEntry("moto", DYNAMODB_EMULATOR, self.moto.pid, port=self.moto.port))
        if self.kinesalite is not None and self.kinesalite.pid is not None:
            found.append(ProcessEntry("kinesalite", KINESIS_EMULATOR, self.kinesalite.pid,
                                      port=self.kinesalite.port))
        return found

    def stop(self) -> None:
        """Stop both (idempotent)."""
        if self.moto is not None:
            self._supervisor.stop([self.moto], grace=5.0)
        if self.kinesalite is not None:
            self.kinesalite.stop()
