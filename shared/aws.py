"""AWS client construction from Settings: endpoint overrides for emulators, our own retry policy on top.

Clients are botocore's, made by a botocore session: what boto3's `client()` returns for these services, without
importing boto3 (its import pulls s3transfer and multiprocessing in, about 3 MB of a MultiLang agent's memory).

Model files are kept lean (`LeanModelFiles`, decision 0024): botocore's legacy endpoint table (endpoints.json, 6.7 MB
once parsed, every partition's hostnames for some 300 services) keeps only the services this process has clients
of, and the operations and shapes of service models lose their documentation strings (read only for docstrings).
Invariant: nothing a request needs is dropped; a service left out of the table resolves as any service botocore's
table does not list (the partition's default hostname; its endpoint rule set decides the URL, as for every service
here), so every request goes where, and is signed as, with botocore's full files (tests/test_aws_models.py).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import threading
from datetime import UTC, datetime
from functools import cache
from typing import Any

import botocore.session
from botocore.config import Config
from botocore.loaders import JSONFileLoader
from botocore.utils import parse_timestamp

from shardherd.shared.kinesis_parser import KinesisParserFactory

# shardherd retries transient errors itself (shared/retry.py) so backoff uses the injected clock and a typed error;
# botocore's own retries are limited to one attempt to avoid retry multiplication.
_CLIENT_CONFIG = Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=5, read_timeout=30,
                        max_pool_connections=50)


# Each client has its own botocore session (credentials resolved as boto3 would for a new session), but all share one
# loader of service models: a MultiLang agent process holds four clients (decision 0024's memory figures).
_CREATING = threading.Lock()


# The services whose entries the endpoint table keeps: those shardherd makes clients of, and STS (the credential
# chain's web identity and assume-role providers).
ENDPOINT_SERVICES = frozenset({"kinesis", "dynamodb", "s3", "sts"})


class LeanModelFiles(JSONFileLoader):
    """botocore's JSON file loader, keeping of the endpoint table and of service models only what requests use."""

    def load_file(self, file_path: str) -> Any:
        """The file's data as botocore loads it, less what this process never reads (see the module's docstring)."""
        name = os.path.basename(file_path)
        if name == "endpoints":
            table = _endpoint_table(file_path)
            if table is not None:
                return table
        data = super().load_file(file_path)
        if name == "service-2" and isinstance(data, dict):  # botocore reads them with .get (clientContextParams not)
            return {**data, **{part: without_documentation(data[part]) for part in ("operations", "shapes")
                               if part in data}}
        return data


def _endpoint_table(file_path: str) -> Any:
    """The endpoint table at `file_path` (.json or .json.gz, as botocore looks) with ENDPOINT_SERVICES only, or None.

    Parsed whole (6.7 MB of botocore's ordered dicts) and then filtered, the table left the process 6-7 MiB larger
    than the part it keeps needs: freed memory stays between the objects kept. Here the other services' entries are
    cut from the text first, each parsed only to find its end and dropped at once (`_kept_text`), and what is left
    is parsed with each partition's services filtered again (`_kept_services`: the same table if the text held a
    surprise). A Kinesis client's resident memory: 9.2 MiB with the whole table parsed, 2.5 MiB with only the
    kept table's text (decision 0024).
    """
    for suffix, opener in ((".json", open), (".json.gz", gzip.open)):
        path = file_path + suffix
        if os.path.isfile(path):
            with opener(path, "rb") as source:
                return json.loads(_kept_text(source.read().decode("utf-8")), object_pairs_hook=_kept_services)
    return None


_SERVICES = re.compile(r'"services"\s*:\s*\{')


def _kept_text(text: str) -> str:
    """The endpoint table's JSON text with each `"services": {...}` object holding ENDPOINT_SERVICES' members only."""
    decoder = json.JSONDecoder()
    pieces: list[str] = []
    copied = 0
    for found in _SERVICES.finditer(text):
        if found.start() < copied:
            continue  # inside a services object already cut
        kept, at = [], found.end()
        while text[at := _past_space(text, at)] != "}":
            name, at = decoder.raw_decode(text, at)
            start = _past_space(text, _past_space(text, at) + 1)  # past the colon
            _, at = decoder.raw_decode(text, start)  # the entry, dropped at once
            if name in ENDPOINT_SERVICES:
                kept.append(f"{json.dumps(name)}: {text[start:at]}")
            at = _past_space(text, at)
            at += text[at] == ","
        pieces += [text[copied:found.end()], ", ".join(kept)]
        copied = at
    return "".join([*pieces, text[copied:]])


def _past_space(text: str, at: int) -> int:
    """The index of the first character at or after `at` that is not JSON whitespace."""
    while text[at] in " \t\r\n":
        at += 1
    return at


def _kept_services(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object of the endpoint table; a partition's (it names its `partition`) with ENDPOINT_SERVICES only."""
    value = dict(pairs)
    services = value.get("services")
    if "partition" in value and isinstance(services, dict):
        value["services"] = {name: entry for name, entry in services.items() if name in ENDPOINT_SERVICES}
    return value


def without_documentation(value: Any) -> Any:
    """A JSON value with every "documentation" member of its objects left out (objects become plain dicts)."""
    if isinstance(value, dict):
        return {key: without_documentation(item) for key, item in value.items() if key != "documentation"}
    if isinstance(value, list):
        return [without_documentation(item) for item in value]
    return value


@cache
def _models() -> Any:
    """The process's one loader of service models (8-10 MB of parsed models per client otherwise), lean."""
    loader = botocore.session.get_session().get_component("data_loader")
    loader.file_loader = LeanModelFiles()
    return loader


def make_client(service: str, region: str, endpoint_url: str | None = None,
                timeouts: tuple[float, float] | None = None) -> Any:
    """A client for `service`; credentials come from the standard chain (dummy ones for an emulator).

    `timeouts` (connect, read seconds) replace the defaults for a caller with a deadline of its own (shard sync).
    """
    config = _CLIENT_CONFIG if timeouts is None else _CLIENT_CONFIG.merge(
        Config(connect_timeout=timeouts[0], read_timeout=timeouts[1]))
    with _CREATING:
        core = botocore.session.get_session()
        core.register_component("data_loader", _models())
        if service == "kinesis":  # records parsed without botocore's generic walk (shared/kinesis_parser.py)
            core.register_component("response_parser_factory", KinesisParserFactory())
        core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=utc_timestamp)
        extra: dict[str, Any] = {}
        if endpoint_url:
            extra["endpoint_url"] = endpoint_url
            if core.get_credentials() is None:
                extra.update(aws_access_key_id="local", aws_secret_access_key="local")
        client: Any = core.create_client(service, region_name=region, config=config, **extra)
    return client


def utc_timestamp(value: Any) -> datetime:
    """The timestamp parser the clients get: botocore's, without its cost for epoch numbers (the same instant, UTC).

    Kinesis gives every record's ApproximateArrivalTimestamp as epoch seconds; botocore's default turns each into a
    datetime in the local zone through dateutil, which was a quarter of a MultiLang agent's CPU while draining a
    backlog (py-spy). Other forms (ISO strings) go to botocore's parser as before.
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)
    parsed: datetime = parse_timestamp(value)
    return parsed
