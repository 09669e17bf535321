"""Fixtures of the MultiLang tests: the session's kinesalite and moto server, a stack per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from tests.coordinator.conftest import kinesalite  # noqa: F401
from tests.multilang.stack import MultiLangStack


@pytest.fixture
def two_shards(moto_server: MotoServer, kinesalite: NodeEmulator, tmp_path: Path) -> Iterator[MultiLangStack]:  # noqa: F811
    """A 2-shard stream and a fresh application."""
    stack = MultiLangStack(moto_server.endpoint_url, kinesalite.endpoint_url, tmp_path, shards=2)
    yield stack
    stack.close()
