"""A plain agent's process loads only what its paths need (tests/support/agent_imports.py builds one, offline).

What `shardherd up --no-spark` runs 32 of on two cores: each module it holds costs every agent its import time and
resident memory (bench/agent_footprint.py measures both).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.agent_imports import DEFERRED, STORES, build_agent, store_env

# What each store needs of DEFERRED.
NEEDED = {"dynamodb": (), "postgres": ("psycopg", "sqlalchemy"), "sqlite": ("sqlalchemy", "sqlite3")}


@pytest.mark.parametrize("store", sorted(STORES))
def test_a_built_plain_agent_holds_only_its_stores_deferred_modules_and_no_tls_context(store: str,
                                                                                        tmp_path: Path) -> None:
    built = build_agent(store_env(store, tmp_path))
    assert built.loaded == NEEDED[store], {name: DEFERRED[name] for name in built.loaded}
    assert not built.tls  # its coordinator URL is plain http: no CA bundle loaded


def test_a_health_port_does_not_load_its_server_before_the_agent_starts(tmp_path: Path) -> None:
    built = build_agent({**store_env("dynamodb", tmp_path), "SHARDHERD_AGENT_HEALTH_PORT": "0"})
    assert "prometheus_client" not in built.loaded
