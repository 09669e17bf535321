"""Bearer tokens: two credentials, and what a caller without one may cost the leader.

Invariants (docs/decisions/0021-api-credentials-and-load.md):
* The admin token (`api_token` / `api_token_file`) is the only credential that changes anything (drain, undrain);
  it reads too. The read token (`api_read_token` / `api_read_token_file`) is what agents send: reads and the
  assignment channel, never a mutation (403). The two must differ.
* With a token configured, a caller is ADMIN or READ only with a valid token, and ANONYMOUS without a header. A sent
  token is always checked: a wrong or malformed one is 401 on every endpoint, logged as a warning (at most one line
  per `LOUD_EVERY_SECONDS`, with the count), never with the token.
* With no token configured at all (development: an open API) callers cannot be told apart and every one counts as
  READ: the rate limits below still hold, the "anonymous callers cost nothing" rule cannot (a warning at start).
* Reads are open to anonymous callers unless `api_protect_reads`; an anonymous request never makes the replica read
  the store or the leader scan (services/api/snapshot.py, changes.py, plan.py).
* Each token comes from its setting or its file; a file is re-read when it changes, so a rotated Secret takes effect
  without a restart. Tokens are compared with `hmac.compare_digest`.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from typing import Annotated, NoReturn

from fastapi import Depends, HTTPException, Request, Security, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from shardherd.shared.api_token import TokenSource
from shardherd.shared.config import Settings
from shardherd.shared.errors import ConfigError

log = logging.getLogger(__name__)

BEARER = "bearer"
LOUD_EVERY_SECONDS = 10.0


class Access(enum.IntEnum):
    """What a request's credential allows (ordered: each level allows what the ones below it do)."""

    ANONYMOUS = 0
    READ = 1
    ADMIN = 2


class _LoudLog:
    """A warning per refused request, at most one line per LOUD_EVERY_SECONDS (with how many it stands for)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._last = -LOUD_EVERY_SECONDS
        self._quiet = 0

    def refused(self, request: Request, why: str) -> None:
        now = time.monotonic()
        with self._guard:
            if now - self._last < LOUD_EVERY_SECONDS:
                self._quiet += 1
                return
            quiet, self._quiet, self._last = self._quiet, 0, now
        client = request.client.host if request.client is not None else "?"
        more = f" ({quiet} more refused since the last line)" if quiet else ""
        log.warning("API: refused %s %s from %s: %s%s", request.method, request.url.path, client, why, more)


class ApiTokens:
    """The replica's two credentials and its read policy; `access` tells what a request's header allows."""

    def __init__(self, admin: TokenSource, read: TokenSource, protect_reads: bool) -> None:
        self.admin = admin
        self.read = read
        self.protect_reads = protect_reads
        self.loud = _LoudLog()
        if protect_reads and not (admin.configured or read.configured):
            raise ConfigError("api_protect_reads needs api_read_token(_file) or api_token(_file)")
        if not (admin.configured or read.configured):
            log.warning("API: no api_token or api_read_token is configured: every caller counts as a reader (its "
                        "requests may make this replica read the store and the leader scan, at a limited rate)")
        if admin.configured and read.configured and admin.current() == read.current():
            raise ConfigError("api_read_token and api_token must differ: the read token is the agents', the admin "
                              "token drains workers")

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiTokens:
        """The credentials the settings describe."""
        return cls(TokenSource.of(settings, "api_token"), TokenSource.of(settings, "api_read_token"),
                   settings.api_protect_reads)

    def for_peers(self) -> TokenSource:
        """The token this replica sends to the others (reads only): the read token, else the admin token."""
        return self.read if self.read.configured else self.admin

    def access(self, request: Request) -> Access:
        """What the request's Authorization header allows; 401 (logged) for a malformed or wrong token."""
        header = request.headers.get("authorization")
        if not (self.admin.configured or self.read.configured):
            return Access.READ  # an open API: nothing to tell callers apart by (a sent token is not checked)
        if header is None:
            return Access.ANONYMOUS
        scheme, _, given = header.partition(" ")
        given = given.strip()
        if scheme.lower() != BEARER or not given:
            self._refuse(request, "malformed Authorization header (Bearer <token>)", "Bearer")
        if self.admin.configured and self.admin.matches(given):
            return Access.ADMIN
        if self.read.configured and self.read.matches(given):
            return Access.READ
        self._refuse(request, "wrong bearer token", 'Bearer error="invalid_token"')

    def _refuse(self, request: Request, why: str, challenge: str) -> NoReturn:
        self.loud.refused(request, why)
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, why, headers={"WWW-Authenticate": challenge})


# Declares the scheme in the OpenAPI document (components.securitySchemes, and `security` on each operation that
# checks a token); the checks themselves are ApiTokens.access and the two dependencies below.
BEARER_SCHEME = HTTPBearer(auto_error=False, scheme_name="bearerToken",
                           description="The admin token (api_token / api_token_file) for mutating endpoints; the "
                                       "read token (api_read_token / api_read_token_file) or the admin token for "
                                       "reads, /metrics and the assignment channel (needed there with "
                                       "api_protect_reads).")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(BEARER_SCHEME)]


async def _tokens(request: Request) -> ApiTokens:
    tokens: ApiTokens = request.app.state.ctx.tokens
    return tokens


def require_token(request: Request, tokens: Annotated[ApiTokens, Depends(_tokens)], _: Credentials) -> None:
    """Dependency of every mutating endpoint: the admin token (403 if none is configured, or for the read token)."""
    if not tokens.admin.configured:
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            "mutating endpoints are disabled: no api_token or api_token_file is configured")
    access = tokens.access(request)
    if access is Access.ANONYMOUS:
        tokens.loud.refused(request, "no bearer token")
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer token (Authorization: Bearer <token>)",
                            headers={"WWW-Authenticate": "Bearer"})
    if access is not Access.ADMIN:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "the read token cannot change anything: send the admin token")
    request.state.access = access


async def require_read_token(request: Request, tokens: Annotated[ApiTokens, Depends(_tokens)],
                             _: Credentials) -> None:
    """Dependency of read endpoints: a token is required with `api_protect_reads`, else checked only if sent.

    Async, so a read costs no worker thread hop for it: nothing here waits (a token file is re-read only when its
    modification time changed, a local stat per request).

    The caller's access is left on `request.state.access` for handlers that serve anonymous callers differently.
    """
    access = tokens.access(request)
    if access is Access.ANONYMOUS and tokens.protect_reads:
        tokens.loud.refused(request, "no bearer token (api_protect_reads)")
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer token (Authorization: Bearer <token>)",
                            headers={"WWW-Authenticate": "Bearer"})
    request.state.access = access


def access_of(request: Request) -> Access:
    """The access `require_read_token` or `require_token` found for this request (ANONYMOUS if neither ran)."""
    access: Access = getattr(request.state, "access", Access.ANONYMOUS)
    return access


AUTH_RESPONSES: dict[int | str, dict[str, object]] = {
    401: {"description": "missing (where required) or wrong bearer token"},
    403: {"description": "no admin token configured, or the read token on a mutating endpoint"},
}
