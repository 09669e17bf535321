"""A stand-in for the Kubernetes API's pod endpoints on 127.0.0.1, over TLS with its own self-signed CA.

It serves what `shardherd mark-removal` calls, as the API server documents them: GET of a namespace's pods with an
equality `labelSelector` (`a=b,c=d`), and PATCH of one pod with a JSON merge patch (`application/merge-patch+json`;
a null value removes the key). A request without the expected bearer token gets 401, one outside `allowed` verbs 403,
an unknown pod 404, each with a Status body as the API sends it. Every PATCH is recorded.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.faulty_proxy import LoopbackServer


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, written under `directory` (the certificate is its own CA)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "kube-ca.crt", directory / "kube.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class KubeApi(LoopbackServer):
    """Pods (name -> labels, annotations) of namespaces, served over HTTPS to callers with `token`."""

    def __init__(self, directory: Path, token: str) -> None:
        self.token = token
        self.allowed = {"GET", "PATCH"}
        self.pods: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        super().__init__(self._handler_class())
        self.ca_file, key_file = self_signed(directory)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.ca_file, key_file)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)

    def add_pod(self, namespace: str, name: str, labels: dict[str, str],
                annotations: dict[str, str] | None = None) -> None:
        """A pod exists from now on."""
        with self._lock:
            self.pods[(namespace, name)] = {"labels": dict(labels), "annotations": dict(annotations or {})}

    def annotations(self, namespace: str, name: str) -> dict[str, str]:
        """The pod's annotations now."""
        with self._lock:
            return dict(self.pods[(namespace, name)]["annotations"])

    def _list(self, namespace: str, selector: str | None) -> tuple[int, dict[str, Any]]:
        wanted = dict(part.split("=", 1) for part in selector.split(",")) if selector else {}
        with self._lock:
            items = [{"metadata": {"name": name, "namespace": space, "labels": pod["labels"],
                                   "annotations": pod["annotations"]}}
                     for (space, name), pod in sorted(self.pods.items())
                     if space == namespace and all(pod["labels"].get(k) == v for k, v in wanted.items())]
        return 200, {"kind": "PodList", "apiVersion": "v1", "items": items}

    def _patch(self, namespace: str, name: str, content_type: str, body: bytes) -> tuple[int, dict[str, Any]]:
        if content_type != "application/merge-patch+json":
            return 415, _status(415, f"the content type {content_type} is not supported here")
        patch = json.loads(body)
        with self._lock:
            pod = self.pods.get((namespace, name))
            if pod is None:
                return 404, _status(404, f'pods "{name}" not found')
            for key, value in patch.get("metadata", {}).get("annotations", {}).items():
                if value is None:
                    pod["annotations"].pop(key, None)
                else:
                    pod["annotations"][key] = value
            self.patches.append((namespace, name, patch))
            return 200, {"metadata": {"name": name, "annotations": dict(pod["annotations"])}}

    def answer(self, method: str, target: str, headers: Any, body: bytes) -> tuple[int, dict[str, Any]]:
        """The API's answer to one request."""
        if headers.get("Authorization") != f"Bearer {self.token}":
            return 401, _status(401, "Unauthorized")
        if method not in self.allowed:
            return 403, _status(403, f"pods is forbidden: cannot {method.lower()} pods")
        url = urlsplit(target)
        parts = [unquote(part) for part in url.path.strip("/").split("/")]
        if parts[:3] != ["api", "v1", "namespaces"] or len(parts) < 5 or parts[4] != "pods":
            return 404, _status(404, "the server could not find the requested resource")
        if method == "GET" and len(parts) == 5:
            return self._list(parts[3], parse_qs(url.query).get("labelSelector", [None])[0])
        if method == "PATCH" and len(parts) == 6:
            return self._patch(parts[3], parts[5], headers.get("Content-Type", ""), body)
        return 405, _status(405, "the server does not allow this method on the requested resource")

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, payload = api.answer(self.command, self.path, self.headers, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve()

            def do_PATCH(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


def _status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}
