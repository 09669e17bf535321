"""Bearer-token checks: mutating endpoints always need the token; reads only when `api_protect_reads` is set.

The token comes from `api_token` or from the file named by `api_token_file` (a mounted Kubernetes Secret, re-read
when the file changes so a rotated Secret takes effect without a restart). Tokens are compared with
`hmac.compare_digest`. With no token configured, mutating endpoints are refused (fail closed) while reads, health
and metrics keep working; `api_protect_reads` without a token is a configuration error.

Read policy: reads are open by default (a cluster-internal API behind a NetworkPolicy), but a token that is sent
is always checked: a wrong one is 401 on every endpoint, so a client with a stale or mistyped token learns it at
once instead of when it first tries a mutation. The token itself is never logged or returned.
"""

from __future__ import annotations

import hmac
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from shardherd.shared.config import MIN_TOKEN_LENGTH, Settings
from shardherd.shared.errors import ConfigError

BEARER = "bearer"


@dataclass
class _Cached:
    mtime_ns: int
    token: str


class TokenSource:
    """The configured API token: a fixed value or a file's content (stripped), re-read when the file changes."""

    def __init__(self, token: str | None, path: Path | None, protect_reads: bool) -> None:
        self._token = token
        self._path = path
        self.protect_reads = protect_reads
        self._cached: _Cached | None = None
        self._guard = threading.Lock()
        if protect_reads and token is None and path is None:
            raise ConfigError("api_protect_reads needs api_token or api_token_file")
        if path is not None:
            self.current()  # a missing or empty token file fails at start, not at the first drain

    @classmethod
    def from_settings(cls, settings: Settings) -> TokenSource:
        """The token source the settings describe (`api_token` wins over `api_token_file`)."""
        path = Path(settings.api_token_file) if settings.api_token_file and not settings.api_token else None
        token = settings.api_token.get_secret_value() if settings.api_token is not None else None
        return cls(token, path, settings.api_protect_reads)

    @property
    def configured(self) -> bool:
        """True if a token is configured at all."""
        return self._token is not None or self._path is not None

    def current(self) -> str | None:
        """The token now in force; ConfigError if the token file is missing or empty."""
        if self._path is None:
            return self._token
        try:
            mtime = os.stat(self._path).st_mtime_ns
            with self._guard:
                if self._cached is None or self._cached.mtime_ns != mtime:
                    token = self._path.read_text(encoding="utf-8").strip()
                    if len(token) < MIN_TOKEN_LENGTH:
                        raise ConfigError(f"api_token_file {self._path}: the token must have at least "
                                          f"{MIN_TOKEN_LENGTH} characters")
                    self._cached = _Cached(mtime, token)
                return self._cached.token
        except OSError as exc:
            raise ConfigError(f"api_token_file {self._path} cannot be read: {exc.strerror}") from exc

    def check(self, header: str | None) -> None:
        """Raise 401 without a bearer token or with a wrong one, 403 if no token is configured."""
        expected = self.current()
        if expected is None:
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                "mutating endpoints are disabled: no api_token or api_token_file is configured")
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != BEARER or not given.strip():
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer token (Authorization: Bearer <token>)",
                                headers={"WWW-Authenticate": "Bearer"})
        self._verify(given)

    def check_if_sent(self, header: str | None) -> None:
        """Open reads: no header is fine; a sent header must hold the configured bearer token (401 otherwise)."""
        if header is None:
            return
        scheme, _, given = header.partition(" ")
        if scheme.lower() != BEARER or not given.strip():
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "malformed Authorization header (Bearer <token>)",
                                headers={"WWW-Authenticate": "Bearer"})
        if self.configured:  # with no token configured there is nothing to check a sent one against
            self._verify(given)

    def _verify(self, given: str) -> None:
        expected = self.current()
        if expected is None or not hmac.compare_digest(given.strip().encode(), expected.encode()):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "wrong bearer token",
                                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})


# Declares the scheme in the OpenAPI document (components.securitySchemes, and `security` on each operation that
# checks a token); the check itself is TokenSource.check, which also answers 403 when no token is configured.
BEARER_SCHEME = HTTPBearer(auto_error=False, scheme_name="bearerToken",
                           description="The API token (api_token / api_token_file). Mutating endpoints always need "
                                       "it; reads and /metrics only with api_protect_reads.")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(BEARER_SCHEME)]


def _tokens(request: Request) -> TokenSource:
    tokens: TokenSource = request.app.state.ctx.tokens
    return tokens


def require_token(request: Request, tokens: Annotated[TokenSource, Depends(_tokens)], _: Credentials) -> None:
    """Dependency of every mutating endpoint."""
    tokens.check(request.headers.get("authorization"))


def require_read_token(request: Request, tokens: Annotated[TokenSource, Depends(_tokens)], _: Credentials) -> None:
    """Dependency of read endpoints: the token is required with `api_protect_reads`, else checked only if sent."""
    if tokens.protect_reads:
        tokens.check(request.headers.get("authorization"))
    else:
        tokens.check_if_sent(request.headers.get("authorization"))


AUTH_RESPONSES: dict[int | str, dict[str, object]] = {
    401: {"description": "missing (where required) or wrong bearer token"},
    403: {"description": "no token configured: mutating endpoints are disabled"},
}
