"""httpx without its command-line module: import httpx from here.

httpx's package imports its CLI (`httpx._main`, which loads rich, click and pygments) whenever those are installed,
and they are (rich is ours, click comes with uvicorn): about 6 MB in every process that makes an HTTP call (a
MultiLang agent among them; docs/decisions/0024-multilang-daemon.md). Marking `httpx._main` as absent before httpx
is first imported makes httpx fall back to its stub `httpx.main`, which only prints how to get the CLI. No shardherd
process runs httpx's CLI.

Invariant: every shardherd module that uses httpx imports it from here, so whichever imports it first leaves the CLI
out (a process that imported httpx before is left as it is).
"""

from __future__ import annotations

import sys

sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]  # None: "not importable", as the import system documents

import httpx  # noqa: E402  # after the line above, by design

__all__ = ["httpx"]
