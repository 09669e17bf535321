"""Poison destination URLs (agent/quarantine.py), parsed where settings are validated and where destinations open.

A destination is `file:///absolute/directory` or `s3://bucket[/prefix]`; anything else is a BadDestination, a
ConfigError (one line, nothing written).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from shardherd.shared.errors import ConfigError


class BadDestination(ConfigError):
    """A poison destination URL is malformed, or the destination does not exist or does not take writes."""


def parse_destination(url: str) -> tuple[str, str, str]:
    """(scheme, directory or bucket, prefix) of a destination URL; BadDestination when it is not a usable one."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise BadDestination(f"poison destination {url!r}: a file destination is file:///absolute/directory")
        return "file", parts.path, ""
    if parts.scheme == "s3":
        if not parts.netloc or parts.query or parts.fragment:
            raise BadDestination(f"poison destination {url!r}: an S3 destination is s3://bucket[/prefix]")
        return "s3", parts.netloc, parts.path.strip("/")
    raise BadDestination(f"poison destination {url!r}: use file:///absolute/directory or s3://bucket[/prefix]")
