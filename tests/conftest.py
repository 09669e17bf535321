"""Session fixtures: a moto server and a PostgreSQL server on 127.0.0.1, and a fresh store per test and backend."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.store import LeaseStore
from tests.support.postgres import PostgresServer
from tests.support.stores import BACKENDS, make_store

# Property tests draw the same examples on every run (the standards: randomness is seeded); a search for new
# counterexamples is `HYPOTHESIS_PROFILE=explore pytest ...`.
settings.register_profile("seeded", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "seeded"))


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    """One moto server process (DynamoDB emulator) for the whole session."""
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the whole session."""
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def dynamodb_client(moto_server: MotoServer) -> Any:
    """A boto3 DynamoDB client talking HTTP to the session's moto server."""
    return make_client("dynamodb", "us-east-1", moto_server.endpoint_url)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LeaseStore]:
    """A fresh store (new tables) on each backend in turn: DynamoDB on moto, SQLite, PostgreSQL."""
    backend: str = request.param
    kwargs: dict[str, Any] = {}
    if backend == "dynamodb":
        kwargs["moto_url"] = request.getfixturevalue("moto_server").endpoint_url
    elif backend == "postgres":
        kwargs["postgres_url"] = request.getfixturevalue("postgres_server").url
    else:
        kwargs["sqlite_path"] = str(tmp_path / "leases.db")
    opened = make_store(backend, **kwargs)
    try:
        yield opened
    finally:
        opened.close()
