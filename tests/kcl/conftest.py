"""Fixtures of the KCL interop tests: an h2c proxy in front of the session's kinesalite, and the stack."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shardherd.services.emulators.h2c_proxy import H2cProxy
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from tests.coordinator.conftest import kinesalite  # noqa: F401
from tests.kcl.harness import InteropStack


@pytest.fixture(scope="session")
def h2c_proxy(kinesalite: NodeEmulator) -> Iterator[H2cProxy]:  # noqa: F811
    """Java KCL workers reach kinesalite through this proxy (the Java SDK speaks HTTP/2 to Kinesis)."""
    with H2cProxy(kinesalite.port) as proxy:
        yield proxy


@pytest.fixture(params=["worker", "lease"], ids=["worker-liveness", "lease-liveness"])
def interop(request: pytest.FixtureRequest, moto_server: MotoServer, kinesalite: NodeEmulator,  # noqa: F811
            h2c_proxy: H2cProxy, tmp_path: Path) -> Iterator[InteropStack]:
    """A 4-shard stream and a fresh application; shardherd in the liveness mode a test asks for (indirect)."""
    stack = InteropStack(moto_server, kinesalite, h2c_proxy, tmp_path, shards=4, liveness=request.param)
    yield stack
    stack.close()
