"""One API token as configured: a fixed value or a file's content, re-read when the file changes.

Used by the coordinator's API to check tokens (services/api/auth.py), by replicas asking each other, and by agents
sending theirs (agent/assignment_watch.py), so a rotated Secret takes effect everywhere without a restart.

Invariants: the value wins over the file; a file is read again whenever its modification time changes; a token
shorter than MIN_TOKEN_LENGTH or an unreadable file is a ConfigError naming the setting, never the token.
"""

from __future__ import annotations

import hmac
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from shardherd.shared.config import MIN_TOKEN_LENGTH, Settings
from shardherd.shared.errors import ConfigError


@dataclass
class _Cached:
    mtime_ns: int
    token: str


class TokenSource:
    """One configured token: a fixed value or a file's content (stripped), re-read when the file changes."""

    def __init__(self, setting: str, token: str | None, path: Path | None, check: bool = True) -> None:
        self.setting = setting
        self._token = token
        self._path = path
        self._cached: _Cached | None = None
        self._guard = threading.Lock()
        if path is not None and check:
            self.current()  # a missing or empty token file fails at start, not at the first request

    @classmethod
    def of(cls, settings: Settings, setting: str) -> TokenSource:
        """The token named `setting` (`api_token` or `api_read_token`); the value wins over `<setting>_file`."""
        value = getattr(settings, setting)
        file = getattr(settings, f"{setting}_file")
        path = Path(file) if file and value is None else None
        return cls(setting, value.get_secret_value() if value is not None else None, path)

    @property
    def configured(self) -> bool:
        """True if a token is configured at all."""
        return self._token is not None or self._path is not None

    def current(self) -> str | None:
        """The token now in force; ConfigError if the token file is missing or too short."""
        if self._path is None:
            return self._token
        try:
            mtime = os.stat(self._path).st_mtime_ns
            with self._guard:
                if self._cached is None or self._cached.mtime_ns != mtime:
                    token = self._path.read_text(encoding="utf-8").strip()
                    if len(token) < MIN_TOKEN_LENGTH:
                        raise ConfigError(f"{self.setting}_file {self._path}: the token must have at least "
                                          f"{MIN_TOKEN_LENGTH} characters")
                    self._cached = _Cached(mtime, token)
                return self._cached.token
        except OSError as exc:
            raise ConfigError(f"{self.setting}_file {self._path} cannot be read: {exc.strerror}") from exc

    def matches(self, given: str) -> bool:
        """True if `given` is the token now in force (constant-time)."""
        expected = self.current()
        return expected is not None and hmac.compare_digest(given.encode(), expected.encode())
