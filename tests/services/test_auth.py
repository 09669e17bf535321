"""Bearer-token rules: mutating endpoints need the token; reads only with api_protect_reads; constant-time compare."""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardherd.shared.errors import ConfigError
from shardherd.shared.store import LeaseStore
from tests.services.harness import TOKEN, Replica
from tests.support.stores import make_store, worker_record


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[LeaseStore]:
    store = make_store("sqlite", sqlite_path=str(tmp_path / "auth.db"))
    yield store
    store.close()


def _seeded(store: LeaseStore, **settings: Any) -> Replica:
    replica = Replica(store, shards=2, **settings)
    replica.join("w1")
    replica.step(1)
    return replica


def test_mutations_need_the_right_token(sqlite_store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> None:
    replica = _seeded(sqlite_store, api_token=TOKEN)
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(given: bytes, expected: bytes) -> bool:
        compared.append((given, expected))
        return real(given, expected)

    monkeypatch.setattr(hmac, "compare_digest", spy)  # the module auth calls into
    missing = replica.client.post("/v1/workers/w1/drain")
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert replica.client.post("/v1/workers/w1/drain", headers={"Authorization": "Basic abc"}).status_code == 401
    wrong = replica.client.post("/v1/workers/w1/drain", headers={"Authorization": "Bearer " + TOKEN[:-1] + "X"})
    assert wrong.status_code == 401 and wrong.json()["detail"] == "wrong bearer token"
    assert TOKEN not in wrong.text
    record = worker_record(sqlite_store, "w1")
    assert record is not None and not record.drain_requested
    assert replica.client.post("/v1/workers/w1/drain", headers=replica.auth()).status_code == 200
    assert compared == [((TOKEN[:-1] + "X").encode(), TOKEN.encode()), (TOKEN.encode(), TOKEN.encode())]
    assert replica.client.get("/v1/workers").status_code == 200  # reads stay open by default


def test_without_a_token_mutations_are_refused_and_reads_work(sqlite_store: LeaseStore) -> None:
    replica = _seeded(sqlite_store)
    refused = replica.client.post("/v1/workers/w1/drain", headers={"Authorization": "Bearer anything-at-all-123"})
    assert refused.status_code == 403 and "no api_token" in refused.json()["detail"]
    assert replica.client.get("/v1/assignments").status_code == 200


def test_protected_reads(sqlite_store: LeaseStore) -> None:
    replica = _seeded(sqlite_store, api_token=TOKEN, api_protect_reads=True)
    for path in ("/v1/workers", "/v1/assignments", "/v1/leader", "/metrics"):
        assert replica.client.get(path).status_code == 401, path
        assert replica.client.get(path, headers=replica.auth()).status_code == 200, path
    assert replica.client.post("/v1/plan").status_code == 401
    assert replica.client.get("/healthz").status_code == 200  # probes never need a token
    assert replica.client.get("/readyz").status_code == 200
    assert replica.client.get("/").status_code == 200  # the page asks for the token itself


def test_protect_reads_without_token_is_a_config_error(sqlite_store: LeaseStore) -> None:
    with pytest.raises(ConfigError, match="api_protect_reads"):
        Replica(sqlite_store, api_protect_reads=True)


def test_token_file_is_read_and_rotated(sqlite_store: LeaseStore, tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    replica = _seeded(sqlite_store, api_token_file=str(secret))
    assert replica.client.post("/v1/workers/w1/drain", headers=replica.auth()).status_code == 200
    rotated = "rotated-token-abcdefghijkl"
    secret.write_text(rotated)
    stat = secret.stat()
    os.utime(secret, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert replica.client.post("/v1/workers/w1/undrain", headers=replica.auth()).status_code == 401
    good = replica.client.post("/v1/workers/w1/undrain", headers={"Authorization": f"Bearer {rotated}"})
    assert good.status_code == 200


@pytest.mark.parametrize("content", [None, "short"])
def test_bad_token_file_fails_at_start(sqlite_store: LeaseStore, tmp_path: Path, content: str | None) -> None:
    secret = tmp_path / "token"
    if content is not None:
        secret.write_text(content)
    with pytest.raises(ConfigError, match="api_token_file"):
        Replica(sqlite_store, api_token_file=str(secret))


READS = ("/v1/workers", "/v1/assignments", "/v1/poison", "/v1/leader", "/metrics")


def test_open_reads_accept_no_token_and_the_right_one_but_reject_a_wrong_one(sqlite_store: LeaseStore) -> None:
    replica = _seeded(sqlite_store, api_token=TOKEN)
    for path in READS:
        assert replica.client.get(path).status_code == 200, path
        assert replica.client.get(path, headers=replica.auth()).status_code == 200, path
        wrong = replica.client.get(path, headers={"Authorization": "Bearer hunter2-secret-but-wrong"})
        assert wrong.status_code == 401, path
        assert wrong.headers["www-authenticate"].startswith("Bearer"), path
        assert "hunter2" not in wrong.text and TOKEN not in wrong.text
        assert replica.client.get(path, headers={"Authorization": "Basic abc"}).status_code == 401, path


def test_open_reads_without_a_configured_token_ignore_a_sent_one(sqlite_store: LeaseStore) -> None:
    replica = _seeded(sqlite_store)
    assert replica.client.get("/v1/workers", headers={"Authorization": "Bearer anything-at-all-123"}).status_code == 200


def test_no_response_carries_the_token(sqlite_store: LeaseStore) -> None:
    replica = _seeded(sqlite_store, api_token=TOKEN)
    for path in (*READS, "/healthz", "/readyz", "/openapi.json"):
        response = replica.client.get(path, headers=replica.auth())
        assert TOKEN not in response.text, path
