"""`shardherd mark-removal`: the example's command, run as written in helm/examples/removal-marker.yaml, against a real
coordinator API (the harness's replica: real store, lock and leader loop, served by uvicorn on 127.0.0.1) and a
stand-in Kubernetes API over TLS (tests/support/kube_api.py). The pod the leader names `remove_first` gets the lowest
deletion cost, the mark moves off every other pod of the selector, pods outside the selector and other costs are left
alone, a rotated service-account token is picked up, and every failure is one line with exit code 2. About 5 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]  # types-PyYAML is not a dev dependency

from shardherd.services.api import create_app
from shardherd.services.api.server import ApiServer
from shardherd.services.cli import main
from shardherd.services.removal_cli import DELETION_COST, MARK
from shardherd.shared.store import LeaseStore
from tests.deploy.rendering import EXAMPLES
from tests.services.harness import TOKEN, Replica
from tests.support.kube_api import KubeApi
from tests.support.stores import make_store

NAMESPACE = "kclpy-apps"
LABELS = {"app.kubernetes.io/name": "orders-kclpy"}
WORKERS = ("w1", "w2", "w3")


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[Replica]:
    store: LeaseStore = make_store("sqlite", sqlite_path=str(tmp_path / "removal.db"))
    leader = Replica(store, shards=6, publish_every=0.0, api_token=TOKEN, api_protect_reads=True)
    for worker in WORKERS:
        leader.join(worker)
    leader.step(4)
    yield leader
    store.close()


@pytest.fixture
def api(replica: Replica) -> Iterator[str]:
    server = ApiServer(create_app(replica.context), "127.0.0.1", 0).start()
    yield server.url
    server.stop()


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[KubeApi]:
    with KubeApi(tmp_path, token="kube-token-1") as server:
        for worker in WORKERS:
            server.add_pod(NAMESPACE, worker, LABELS)
        server.add_pod(NAMESPACE, "left-over", LABELS, {DELETION_COST: MARK})  # marked by an earlier round
        server.add_pod(NAMESPACE, "someone-elses", {"app.kubernetes.io/name": "other"}, {DELETION_COST: MARK})
        yield server


def _files(tmp_path: Path, kube: KubeApi) -> tuple[Path, Path]:
    api_token, kube_token = tmp_path / "api-token", tmp_path / "kube-token"
    api_token.write_text(TOKEN + "\n", encoding="utf-8")
    kube_token.write_text(kube.token, encoding="utf-8")
    return api_token, kube_token


def _remove_first(replica: Replica) -> str:
    body = replica.client.get("/v1/scale", headers=replica.auth()).json()
    assert body["remove_first"] in WORKERS, body
    return str(body["remove_first"])


def _until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.1)


def _example_command() -> list[str]:
    documents = list(yaml.safe_load_all((EXAMPLES / "removal-marker.yaml").read_text(encoding="utf-8")))
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return list(container["command"])


def test_the_examples_command_marks_the_leaders_choice_and_follows_a_rotated_token(
        replica: Replica, api: str, kube: KubeApi, tmp_path: Path) -> None:
    command = _example_command()
    assert command[0] == "shardherd" and "--every" in command
    api_token, kube_token = _files(tmp_path, kube)
    # What the pod gets: the in-cluster API's address, the chart's agent env (the coordinator URL) and the read
    # token file; the service account's token and CA are the pod's mounted files, here passed by flag.
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(kube.port),
           "SHARDHERD_COORDINATOR_URL": api, "SHARDHERD_API_READ_TOKEN_FILE": str(api_token)}
    executable = str(Path(sys.executable).parent / command[0])
    process = subprocess.Popen([executable, *command[1:], "--kube-ca", str(kube.ca_file),
                                "--kube-token-file", str(kube_token)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        chosen = _remove_first(replica)

        def marked() -> set[str]:
            return {name for (space, name), pod in kube.pods.items()
                    if space == NAMESPACE and pod["annotations"].get(DELETION_COST) == MARK}

        _until(lambda: marked() == {chosen, "someone-elses"}, 30, f"only {chosen} marked in the selector")
        assert kube.annotations(NAMESPACE, "left-over") == {}  # the earlier mark moved off
        # The service account's token is rotated (and the old one refused); a mark left on another pod (as by a
        # round that raced a change of remove_first) is cleared by a later round with the new token.
        other = next(worker for worker in WORKERS if worker != chosen)
        kube_token.write_text("kube-token-2", encoding="utf-8")
        kube.token = "kube-token-2"
        kube.add_pod(NAMESPACE, other, LABELS, {DELETION_COST: MARK})
        _until(lambda: marked() == {chosen, "someone-elses"}, 40, f"{other}'s mark cleared after the rotation")
    finally:
        process.terminate()
        output = process.communicate(timeout=20)[0]
    assert "unmarked pod left-over" in output and f"pod {chosen} removed first on scale-in" in output, output
    assert f"unmarked pod {other}" in output, output
    patched = [name for _, name, _ in kube.patches]
    assert "someone-elses" not in patched and patched.count(chosen) == 1, patched  # marked once, not every round


def _once(api: str, kube: KubeApi, tmp_path: Path, *extra: str) -> list[str]:
    api_token, kube_token = _files(tmp_path, kube)
    return ["mark-removal", "--namespace", NAMESPACE, "--selector", "app.kubernetes.io/name=orders-kclpy",
            "--url", api, "--token-file", str(api_token), "--kube-api", f"https://127.0.0.1:{kube.port}",
            "--kube-ca", str(kube.ca_file), "--kube-token-file", str(kube_token), *extra]


def test_a_forbidden_patch_is_one_line_and_exit_code_2(replica: Replica, api: str, kube: KubeApi, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    kube.allowed = {"GET"}  # the Role lacks "patch"
    assert main(_once(api, kube, tmp_path)) == 2
    error = capsys.readouterr().err
    assert "HTTP 403" in error and "PATCH /api/v1/namespaces/kclpy-apps/pods/" in error, error
    assert kube.annotations(NAMESPACE, "left-over") == {DELETION_COST: MARK}  # nothing changed


def test_without_a_published_count_the_marks_stay(tmp_path: Path, kube: KubeApi,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    store = make_store("sqlite", sqlite_path=str(tmp_path / "empty.db"))
    idle = Replica(store, shards=2, api_token=TOKEN, api_protect_reads=True)  # nothing published yet: 503
    server = ApiServer(create_app(idle.context), "127.0.0.1", 0).start()
    try:
        assert main(_once(server.url, kube, tmp_path)) == 2
    finally:
        server.stop()
        store.close()
    assert "HTTP 503" in capsys.readouterr().err
    assert kube.patches == [] and kube.annotations(NAMESPACE, "left-over") == {DELETION_COST: MARK}


@pytest.mark.parametrize(("extra", "message"), [
    (("--every", "0"), "--every must be a positive number of seconds"),
])
def test_bad_arguments_are_refused_before_any_call(api: str, kube: KubeApi, tmp_path: Path, extra: tuple[str, ...],
                                                   message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_once(api, kube, tmp_path, *extra)) == 2
    assert message in capsys.readouterr().err
    assert kube.patches == []


def test_outside_a_pod_without_an_api_address_says_so(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["mark-removal", "--namespace", NAMESPACE, "--url", "http://127.0.0.1:9"]) == 2
    assert "not in a Kubernetes pod" in capsys.readouterr().err
