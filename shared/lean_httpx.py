"""httpx without its command-line module, and clients that do not each load a CA bundle: import httpx from here.

httpx's package imports its CLI (`httpx._main`, which loads rich, click and pygments) whenever those are installed,
and they are (rich is ours, click comes with uvicorn): about 6 MB in every process that makes an HTTP call (a
MultiLang agent among them; docs/decisions/0024-multilang-daemon.md). Marking `httpx._main` as absent before httpx
is first imported makes httpx fall back to its stub `httpx.main`, which only prints how to get the CLI. No shardherd
process runs httpx's CLI.

`httpx.Client()` builds a TLS context and loads certifi's CA bundle into it, every time: 90-210 ms of CPU and 3 MB at
the first (a client per heartbeat on 32 agents took a third of a core). `client(urls)` gives every client of the
process one verifying context (shared/plain_http.py's, which an agent's own requests use), made on the first https
URL; a client for plain-http URLs gets none (it never opens a TLS connection: redirects are not followed).

Invariant: every shardherd module that uses httpx imports it from here, so whichever imports it first leaves the CLI
out (a process that imported httpx before is left as it is).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None: "not importable", as the import system documents

import httpx  # noqa: E402  # after the line above, by design

from shardherd.shared.plain_http import tls_context  # noqa: E402  # one context for httpx and plain clients

__all__ = ["client", "httpx", "tls_context"]


def client(urls: Iterable[str], **options: Any) -> httpx.Client:
    """An httpx client (environment ignored, no redirects) for requests to `urls`, with `options` (timeout, ...).

    It verifies TLS with `tls_context()` when any of `urls` is https; for plain-http URLs it builds no CA store.
    """
    secure = any(httpx.URL(url).scheme == "https" for url in urls)
    return httpx.Client(verify=tls_context() if secure else False, trust_env=False, follow_redirects=False,
                        **options)
