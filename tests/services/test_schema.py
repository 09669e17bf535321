"""Schemathesis over the OpenAPI schema: generated requests never get a 5xx and answers match the schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from shardherd.shared.store import LeaseStore
from tests.services.harness import TOKEN, Replica
from tests.support.stores import make_store


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    store: LeaseStore = make_store("sqlite", sqlite_path=str(Path(tmp_path_factory.mktemp("schema")) / "s.db"))
    replica = Replica(store, shards=4, api_token=TOKEN)
    replica.join("w1")
    replica.join("w2", cpu=60.0)
    replica.step(2)
    yield replica
    store.close()


@pytest.fixture(scope="module")
def api_schema(seeded: Replica) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_asgi("/openapi.json", seeded.client.app)


schema = schemathesis.pytest.from_fixture("api_schema")
Operation = schemathesis.APIOperation[Any, Any, Any, Any]


@schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_no_server_errors_and_schema_conformance(case: schemathesis.Case[Operation]) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    response = case.call(headers=headers)
    assert response.status_code < 500, (case.method, case.path, case.query, response.text)
    case.validate_response(response, checks=[schemathesis.checks.not_a_server_error,
                                             schemathesis.checks.status_code_conformance,
                                             schemathesis.checks.content_type_conformance,
                                             schemathesis.checks.response_schema_conformance])
