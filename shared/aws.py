"""boto3 client construction from Settings: endpoint overrides for emulators, our own retry policy on top."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config

# shardherd retries transient errors itself (shared/retry.py) so backoff uses the injected clock and a typed error;
# botocore's own retries are limited to one attempt to avoid retry multiplication.
_CLIENT_CONFIG = Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=5, read_timeout=30,
                        max_pool_connections=50)


def make_client(service: str, region: str, endpoint_url: str | None = None,
                timeouts: tuple[float, float] | None = None) -> Any:
    """A boto3 client for `service`; credentials come from the standard chain (dummy ones for an emulator).

    `timeouts` (connect, read seconds) replace the defaults for a caller with a deadline of its own (shard sync).
    """
    config = _CLIENT_CONFIG if timeouts is None else _CLIENT_CONFIG.merge(
        Config(connect_timeout=timeouts[0], read_timeout=timeouts[1]))
    extra: dict[str, Any] = {}
    if endpoint_url:
        extra["endpoint_url"] = endpoint_url
        session = boto3.session.Session()
        if session.get_credentials() is None:
            extra.update(aws_access_key_id="local", aws_secret_access_key="local")
    client: Any = boto3.session.Session().client(service, region_name=region, config=config, **extra)  # type: ignore[call-overload]
    return client
