"""The AWS emulators of the stack, on 127.0.0.1: moto server for DynamoDB, kinesalite for Kinesis.

With `aws_limits` (the default of `shardherd up`) every Kinesis client of the stack talks to the limits proxy
(services/emulators/limits_proxy.py) in front of kinesalite, which enforces AWS's per-shard limits; its counts are
on `GET <kinesis endpoint>/limits`.

Each is started only when nothing else is configured: an endpoint URL in the settings, `--aws` (real AWS through the
standard boto3 credential chain) or the SQL store backend (no DynamoDB needed) means that emulator is not started.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from shardherd.services.emulators.kinesalite import DEFAULT_SHARD_LIMIT, Kinesalite
from shardherd.services.emulators.limits_launcher import KinesisLimits
from shardherd.services.emulators.ports import LOOPBACK, free_port, port_open, wait_until
from shardherd.services.local_stack.state import ProcessEntry
from shardherd.services.local_stack.supervisor import Child, Supervisor, log_tail
from shardherd.shared.config import Settings
from shardherd.shared.errors import ShardherdError

DYNAMODB_EMULATOR = "dynamodb-emulator"
KINESIS_EMULATOR = "kinesis-emulator"
STARTUP_TIMEOUT = 60.0
# The most open shards the stack's kinesalite allows: AWS's default account quota is 500 (200 in smaller regions),
# and a stream far beyond what this machine can read is refused by the emulator as AWS refuses it.
MAX_LOCAL_SHARDS = 1000


def local_shard_limit(shards: int) -> int:
    """The open-shard limit of the stack's kinesalite for `shards`: room to split each once, up to MAX_LOCAL_SHARDS."""
    return max(DEFAULT_SHARD_LIMIT, min(2 * shards, MAX_LOCAL_SHARDS))


class EmulatorFailed(ShardherdError, RuntimeError):
    """An emulator did not come up."""


@dataclass(frozen=True)
class Endpoints:
    """Endpoint URLs for boto3 (None: the real AWS endpoint of the region)."""

    dynamodb: str | None
    kinesis: str | None


class Emulators:
    """Starts the emulators the configuration lacks, and stops them."""

    def __init__(self, settings: Settings, supervisor: Supervisor, use_aws: bool, aws_limits: bool = True,
                 shard_limit: int = DEFAULT_SHARD_LIMIT) -> None:
        self._settings = settings
        self._shard_limit = shard_limit  # kinesalite's open shards per account (AWS's default quota is 500 or 200)
        self._supervisor = supervisor
        self._use_aws = use_aws
        self._aws_limits = aws_limits
        self.moto: Child | None = None
        self.kinesalite: Kinesalite | None = None
        self.limits: KinesisLimits | None = None
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
            self.kinesalite = Kinesalite(startup_timeout=STARTUP_TIMEOUT, shard_limit=self._shard_limit,
                                         log_path=self._supervisor.log_dir / "kinesalite.log").start()
            kinesis = self.kinesalite.endpoint_url
            if self._aws_limits:
                self.limits = KinesisLimits(self.kinesalite.port, startup_timeout=STARTUP_TIMEOUT,
                                            log_path=self._supervisor.log_dir / "kinesis-limits.log").start()
                kinesis = self.limits.endpoint_url
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
        if self._kinesis_exit_reported:
            return None
        for name, emulator in (("kinesalite", self.kinesalite), ("the kinesis limits proxy", self.limits)):
            if emulator is not None and (code := emulator.exit_code) is not None:
                self._kinesis_exit_reported = True
                return f"{name} exited on its own (code {code}); log: {emulator.log_path}"
        return None

    def entries(self) -> list[ProcessEntry]:
        """The emulator processes, for the state file."""
        found = []
        if self.moto is not None:
            found.append(ProcessEntry("moto", DYNAMODB_EMULATOR, self.moto.pid, port=self.moto.port))
        if self.kinesalite is not None and self.kinesalite.pid is not None:
            found.append(ProcessEntry("kinesalite", KINESIS_EMULATOR, self.kinesalite.pid,
                                      port=self.kinesalite.port))
        if self.limits is not None and self.limits.pid is not None:
            found.append(ProcessEntry("kinesis-limits", KINESIS_EMULATOR, self.limits.pid, port=self.limits.port))
        return found

    def stop(self) -> None:
        """Stop both (idempotent)."""
        if self.moto is not None:
            self._supervisor.stop([self.moto], grace=5.0)
        if self.limits is not None:
            self.limits.stop()
        if self.kinesalite is not None:
            self.kinesalite.stop()
