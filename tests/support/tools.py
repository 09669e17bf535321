"""Command-line tools that the project's own dev dependencies install, found in this interpreter's environment."""

from __future__ import annotations

import sysconfig
from pathlib import Path


def installed_tool(name: str) -> Path:
    """Path of a console tool installed into the running interpreter's environment (its scripts folder).

    Never looked up on PATH: the suite runs as `.venv/bin/python -m pytest` with the venv's `bin/` off PATH, and a
    copy that happens to be on this machine's PATH would hide a missing install step.
    """
    path = Path(sysconfig.get_path("scripts")) / name
    assert path.is_file(), f"{name} is not installed in {path.parent}: pip install -e '.[dev]' installs it"
    return path
