"""Fixtures for coordinator tests: real Kinesis emulator processes (kinesalite, kinesis-local) on 127.0.0.1, and
the stores leader-loop tests run on."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from shardherd.services.emulators.kinesalite import Kinesalite, KinesisLocal, NodeEmulator
from shardherd.shared.store import LeaseStore
from tests.support.stores import make_store

# One HTTP attempt per call: retries are the lister's job (retries on an injected clock), so tests count exactly.
_ONE_ATTEMPT = Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=20)


def kinesis_client(endpoint_url: str) -> Any:
    """A boto3 Kinesis client with dummy credentials for an emulator at `endpoint_url`, without botocore retries."""
    return boto3.client("kinesis", region_name="us-east-1", endpoint_url=endpoint_url, config=_ONE_ATTEMPT,
                        aws_access_key_id="test", aws_secret_access_key="test", aws_session_token="test")


def _run(emulator: NodeEmulator) -> Iterator[NodeEmulator]:
    if shutil.which("node") is None:
        pytest.skip(f"{emulator.package} needs Node.js, which is not on PATH")
    with emulator:
        yield emulator
        # Died mid-session (the tests after it fail on connect, session 7's CI lost kinesalite once): say why.
        assert emulator.running, f"{emulator.package} exited during the session; its output ends with:\n" \
            f"{emulator.output(6000)}"


@pytest.fixture(scope="session")
def kinesalite() -> Iterator[NodeEmulator]:
    """One kinesalite process (correct split/merge, ListShards never paginates) for the whole session."""
    yield from _run(Kinesalite(shard_limit=500))


@pytest.fixture(scope="session")
def kinesis_local() -> Iterator[NodeEmulator]:
    """One kinesis-local process (AWS-style ListShards pagination) for the whole session."""
    yield from _run(KinesisLocal(shard_limit=500))


@pytest.fixture
def kinesis(kinesalite: NodeEmulator) -> Any:
    """A boto3 Kinesis client talking HTTP to the session's kinesalite."""
    return kinesis_client(kinesalite.endpoint_url)


@pytest.fixture(params=["sqlite", "dynamodb"])
def loop_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LeaseStore]:
    """A fresh store for leader-loop tests: SQLite in a temp file, then DynamoDB on the session's moto server."""
    kwargs: dict[str, Any] = {}
    if request.param == "dynamodb":
        kwargs["moto_url"] = request.getfixturevalue("moto_server").endpoint_url
    else:
        kwargs["sqlite_path"] = str(tmp_path / "loop.db")
    store = make_store(request.param, **kwargs)
    yield store
    store.close()
