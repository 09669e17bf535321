"""What a plain agent's process holds once built: its entry point imported and its Agent made, offline.

A fresh interpreter imports what `shardherd agent --processor ...CountingProcessor` imports (the command line, the
agent's subcommand, the processor, as `shardherd up --no-spark` runs it) and builds the Agent from the environment
given, as `agent_service.run` does, without starting it: no store, Kinesis or coordinator call is made (the clients
connect on first use). It reports the seconds and resident memory that took, how many modules it holds, which of
DEFERRED it loaded, and whether it built the process's verifying TLS context (certifi's CA bundle).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from shardherd.services.emulators.ports import LOOPBACK
from shardherd.services.local_stack.stack import PLAIN_PROCESSOR

ROOT = Path(__file__).resolve().parents[2]

# Modules a plain agent loads only on a path that needs them, and that path.
DEFERRED = {
    "prometheus_client": "its health port (agent_health_port)",
    "shardherd.agent.health_server": "its health port (agent_health_port)",
    "shardherd.agent.kpl_protobuf": "the first KPL aggregate it reads",
    "psutil": "a CPU source on a host whose kernel lists no children in /proc (agent/metrics/cpu_tree.py)",
    "google.protobuf": "its KPL C decoder, once it has decoded PAYBACK_RECORDS user records (agent/kpl_decoding.py)",
    "sqlalchemy": "a SQL store",
    "psycopg": "a PostgreSQL store",
    "sqlite3": "a SQLite store",
    "alembic": "a migration (`shardherd check-table`, the coordinator)",
    "boto3": "nothing: its clients are botocore's (shared/aws.py)",
    "httpx": "nothing: its HTTP requests use the standard library's (shared/plain_http.py)",
    "fastapi": "nothing: the coordinator's API",
    "uvicorn": "nothing: the coordinator's API",
    "rich": "nothing: `shardherd up`'s console",
    "pyspark": "nothing: a Spark agent",
}

# Where each store's modules come from (an unreachable PostgreSQL is fine: the Agent is built, not started).
STORES = {
    "dynamodb": {"SHARDHERD_STORE_BACKEND": "dynamodb"},
    "postgres": {"SHARDHERD_STORE_BACKEND": "sql", "SHARDHERD_SQL_URL": f"postgresql+psycopg://nobody@{LOOPBACK}:9/x"},
    "sqlite": {"SHARDHERD_STORE_BACKEND": "sql"},  # the file: sqlite_env
}

_PROBE = """
import json, resource, sys, time
began = time.perf_counter()
from shardherd.services.cli import build_parser
args = build_parser("agent").parse_args(["agent", "--processor", sys.argv[1]])
from shardherd.services.agent_service import load_processor
from shardherd.shared.config import load_settings
from shardherd.agent.runtime import Agent
agent = Agent(load_settings(), load_processor(args.processor))
seconds = time.perf_counter() - began
from shardherd.shared.plain_http import tls_context
print(json.dumps({"seconds": seconds, "modules": len(sys.modules),
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "loaded": sorted(name for name in sys.argv[2:] if name in sys.modules),
                  "tls": tls_context.cache_info().currsize > 0}))
"""


@dataclass(frozen=True)
class Built:
    """A built agent's process: seconds to import and build, peak resident memory (MiB), modules, DEFERRED loaded."""

    seconds: float
    rss_mib: float
    modules: int
    loaded: tuple[str, ...]
    tls: bool  # the verifying TLS context was made


def store_env(store: str, directory: Path) -> dict[str, str]:
    """The SHARDHERD_* variables that pick `store` (a SQLite file in `directory`)."""
    env = dict(STORES[store])
    if store == "sqlite":
        env["SHARDHERD_SQL_URL"] = f"sqlite:///{directory / 'store.db'}"
    return env


def build_agent(env: dict[str, str]) -> Built:
    """Import and build a plain agent in a fresh interpreter with `env` over the inherited non-SHARDHERD variables.

    The agent is on stream `probe` of application `probe`, with the coordinator and Kinesis on unused loopback ports.
    """
    unused = f"http://{LOOPBACK}:9"
    base = {name: value for name, value in os.environ.items() if not name.startswith("SHARDHERD_")}
    probe = {f"SHARDHERD_{name}": "probe" for name in ("STREAM_NAME", "APPLICATION_NAME", "WORKER_ID")}
    endpoints = {f"SHARDHERD_{name}": unused for name in ("COORDINATOR_URL", "KINESIS_ENDPOINT_URL",
                                                          "DYNAMODB_ENDPOINT_URL")}
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    full = {**base, **probe, **endpoints, "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
            "PYTHONPATH": path, **env}
    done = subprocess.run([sys.executable, "-c", _PROBE, PLAIN_PROCESSOR, *DEFERRED], env=full, capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"building a plain agent failed ({done.returncode}): {done.stderr[-2000:]}")
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    return Built(float(shown["seconds"]), float(shown["rss_mib"]), int(shown["modules"]), tuple(shown["loaded"]),
                 bool(shown["tls"]))
