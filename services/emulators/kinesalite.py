"""Runs the Kinesis emulators from npm (kinesalite, kinesis-local) as Node child processes on 127.0.0.1.

Both packages come from `services/emulators/package.json`, installed with `npm ci --prefix services/emulators`.
Each process is started in its own process group, is forced onto the loopback interface (kinesis-local hard-codes
0.0.0.0, so a small prelude rewrites every `listen` to 127.0.0.1), exits by itself when its parent's pipe closes (no
orphans if Python dies), and is stopped by killing its whole group.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import IO, ClassVar, Self

from shardherd.services.emulators.ports import LOOPBACK, free_port, wait_until
from shardherd.shared.errors import ShardherdError

EMULATORS_DIR = Path(__file__).resolve().parent
NODE_MODULES = EMULATORS_DIR / "node_modules"
INSTALL_HINT = "npm ci --prefix services/emulators"

# Runs before the emulator: every server listens on loopback only, and the process ends when stdin closes.
# An HTTP server keeps an idle kept-alive connection open (Node closed it after 5 s): the limits proxy keeps a few
# connections to the emulator and reuses them, and a new connection on a busy emulator waited seconds to be served.
# kinesalite rethrows a request's 'error' event, so a client killed while sending a request (kill -9 of a Spark
# executor or an agent mid-call) ended the whole emulator with "Error: aborted" (ECONNRESET); such a dropped
# connection is now logged and the emulator serves on. Any other uncaught error still ends it with status 1.
# kinesis-local's accept loop reads each accepted socket's addresses and fails the whole server when one is undefined,
# which it is once the client has reset the connection (a connect followed at once by a reset, or a reset before a
# loaded server accepted): the listener closed and the process ran on refusing every connection. An accepted socket
# now keeps the addresses it had when accepted (loopback if already gone), so only that connection fails.
_PRELUDE = """
const net = require('net');
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof this.keepAliveTimeout === 'number') this.keepAliveTimeout = 0;
  const callback = typeof args[args.length - 1] === 'function' ? args.pop() : undefined;
  const options = typeof args[0] === 'object' && args[0] !== null ? {...args[0]} : {port: Number(args[0])};
  options.host = '127.0.0.1';
  return callback ? listen.call(this, options, callback) : listen.call(this, options);
};
const createServer = net.createServer;
net.createServer = function (options, onConnection) {
  if (typeof options === 'function') { onConnection = options; options = {}; }
  if (typeof onConnection !== 'function') return createServer.call(net, options, onConnection);
  return createServer.call(net, options, function (socket) {
    const own = this.address();
    const fallback = {localAddress: '127.0.0.1', localPort: own ? own.port : 0, remoteAddress: '127.0.0.1',
                      remotePort: 0};
    for (const key of Object.keys(fallback)) {
      const value = socket[key];
      Object.defineProperty(socket, key, {value: value === undefined ? fallback[key] : value});
    }
    return onConnection.call(this, socket);
  });
};
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
process.on('uncaughtException', (err) => {
  if (err && (err.code === 'ECONNRESET' || err.code === 'EPIPE')) {
    console.error(`shardherd prelude: a client dropped its connection mid-request (${err.code}); serving on`);
    return;
  }
  console.error(err);
  process.exit(1);
});
"""

DEFAULT_SHARD_LIMIT = 100  # kinesalite's own default of open shards per account


class EmulatorNotInstalled(ShardherdError, RuntimeError):
    """Node or the emulator's npm package is missing; the message says which command installs it."""


class LoopbackServer:
    """A server child process on a loopback port, with its output kept; a context manager, or start()/stop().

    The base of the npm emulators and the Kinesis limits proxy: the child runs in its own process group (stopped by
    killing the group) and its stdin is a pipe from this process, so it can end itself when its parent dies.
    """

    def __init__(self, port: int | None, startup_timeout: float, log_path: Path | None) -> None:
        self.port = port or free_port()
        self.log_path = log_path  # keep the child's output there (else a temporary file, gone after stop())
        self._startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        """The HTTP endpoint to give boto3 clients."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The child's process id while started, else None."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        """True while the child process is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The process's exit status once it ended by itself; None while it runs or after stop()."""
        return self._process.poll() if self._process is not None else None

    def start(self) -> Self:
        """Start the child and wait until it answers."""
        raise NotImplementedError

    def _answers(self) -> bool:
        """Whether the child answers on its port yet."""
        raise NotImplementedError

    def _launch(self, argv: list[str], what: str, cwd: Path | None = None,
                environment: dict[str, str] | None = None) -> None:
        """Run `argv` as the child and wait until `_answers`; on failure stop it and say how its output ends."""
        if self._process is not None:
            raise RuntimeError(f"{what} is already started on port {self.port}")
        # closed by stop()
        self._log = tempfile.TemporaryFile() if self.log_path is None else open(self.log_path, "w+b")  # noqa: SIM115
        self._process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
                                         cwd=cwd, env={**os.environ, **(environment or {})}, start_new_session=True)
        try:
            wait_until(self._answers, self._startup_timeout, f"{what} on port {self.port}", lambda: self.running)
        except RuntimeError as exc:
            output = self.output()
            self.stop()
            raise RuntimeError(f"{exc}; its output ends with:\n{output}") from exc

    def stop(self) -> None:
        """Stop the child and everything in its process group; idempotent."""
        process, self._process = self._process, None
        if process is not None:
            end_process_group(process)
        if self._log is not None:
            self._log.close()
            self._log = None

    def output(self, limit: int = 2000) -> str:
        """The end of the child's output so far (why it failed to start, or why it exited)."""
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-limit:]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class NodeEmulator(LoopbackServer):
    """A Node-based emulator process on a free loopback port; a context manager, or call start()/stop()."""

    package: ClassVar[str]

    def __init__(
        self,
        port: int | None = None,
        startup_timeout: float = 60.0,
        reshard_ms: int = 50,
        shard_limit: int = DEFAULT_SHARD_LIMIT,
        node_modules: Path = NODE_MODULES,
        log_path: Path | None = None,
    ) -> None:
        super().__init__(port, startup_timeout, log_path)
        self.node_modules = node_modules
        self.reshard_ms = reshard_ms  # how long CreateStream, DeleteStream, split and merge stay in a transient state
        self.shard_limit = shard_limit  # open shards allowed per account

    def _script(self, package_dir: Path) -> str:
        """JavaScript (after the prelude) that starts the emulator on `self.port`."""
        raise NotImplementedError

    def _environment(self) -> dict[str, str]:
        """Extra environment variables for the Node process."""
        return {}

    def _package_dir(self) -> Path:
        """Where the emulator's npm package is installed (its `package.json` proves the install)."""
        return self.node_modules / self.package

    def start(self) -> Self:
        """Start the emulator and wait until it answers HTTP on its port."""
        node = shutil.which("node")
        if node is None:
            raise EmulatorNotInstalled(f"{self.package} needs Node.js (20 or newer) on PATH, then `{INSTALL_HINT}`")
        package_dir = self._package_dir()
        if not (package_dir / "package.json").is_file():
            raise EmulatorNotInstalled(f"{self.package} is not installed in {self.node_modules}: run `{INSTALL_HINT}`")
        self._launch([node, "-e", _PRELUDE + self._script(package_dir)], self.package, cwd=package_dir,
                     environment=self._environment())
        return self

    def _answers(self) -> bool:
        connection = http.client.HTTPConnection(LOOPBACK, self.port, timeout=1.0)
        try:
            connection.request("GET", "/")
            connection.getresponse().read()
        except OSError:
            return False
        finally:
            connection.close()
        return True


class Kinesalite(NodeEmulator):
    """kinesalite 3.3.3: fast Kinesis emulator with correct split/merge (no UpdateShardCount, no StreamARN)."""

    package = "kinesalite"

    def _script(self, package_dir: Path) -> str:
        options = {
            "createStreamMs": self.reshard_ms,
            "deleteStreamMs": self.reshard_ms,
            "updateStreamMs": self.reshard_ms,
            "shardLimit": self.shard_limit,
        }
        return f"require({json.dumps(str(package_dir))})({json.dumps(options)}).listen({self.port}, '127.0.0.1');"


class KinesisLocal(NodeEmulator):
    """kinesis-local 0.6.2 (kinesis-mock): AWS-style ListShards pagination, UpdateShardCount, ChildShards."""

    package = "kinesis-local"

    def _script(self, package_dir: Path) -> str:
        return f"require({json.dumps(str(package_dir / 'main.js'))});"

    def _environment(self) -> dict[str, str]:
        duration = f"{self.reshard_ms}ms"
        env = {
            "KINESIS_MOCK_PLAIN_PORT": str(self.port),
            "KINESIS_MOCK_TLS_PORT": str(free_port()),
            "KINESIS_MOCK_CERT_PATH": str(self.node_modules / self.package / "server.json"),
            "SHARD_LIMIT": str(self.shard_limit),
            "LOG_LEVEL": "WARN",
            "SHOULD_PERSIST_DATA": "false",
        }
        for name in ("CREATE_STREAM", "DELETE_STREAM", "MERGE_SHARDS", "SPLIT_SHARD", "UPDATE_SHARD_COUNT"):
            env[f"{name}_DURATION"] = duration
        return env


def end_process_group(process: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM the process's group, then SIGKILL it if it has not exited within `grace` seconds."""
    if process.stdin is not None:
        process.stdin.close()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    process.wait()
