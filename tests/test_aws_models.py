"""shared/aws.py's lean model files: requests go where, and are signed as, botocore's full files would make them;
the process keeps less of the files (the point: a MultiLang agent's resident memory, decision 0024)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import botocore
import botocore.session
import pytest
from botocore.loaders import JSONFileLoader

from shardherd.shared.aws import ENDPOINT_SERVICES, LeanModelFiles, _kept_text, _models, make_client

# Services kept in the endpoint table and some left out (global, regional, newer); partitions of every kind.
CALLS = {"kinesis": "list_streams", "dynamodb": "list_tables", "s3": "list_buckets",
         "sts": "get_caller_identity", "sqs": "list_queues", "iam": "list_users"}
REGIONS = ["us-east-1", "ap-southeast-3", "cn-north-1", "us-gov-west-1"]


class Captured(Exception):
    """Raised in place of sending: the request as it would have gone out."""

    def __init__(self, url: str, scope: str) -> None:
        super().__init__(url)
        self.url, self.scope = url, scope


def capture(request: Any, **_: Any) -> None:
    """botocore's before-send hook: stop the request, keeping its URL and its signature's region/service."""
    authorization = request.headers.get("Authorization", b"")
    text = authorization.decode() if isinstance(authorization, bytes) else str(authorization)
    credential = text.split("Credential=", 1)[1].split(",", 1)[0] if "Credential=" in text else ""
    raise Captured(request.url, "/".join(credential.split("/")[2:4]))


def sent(client: Any, operation: str) -> tuple[str, str]:
    """Where `operation` would be sent, and the region/service it would be signed for."""
    client.meta.events.register("before-send", capture)
    with pytest.raises(Captured) as caught:
        getattr(client, operation)()
    return caught.value.url, caught.value.scope


@pytest.mark.parametrize("region", REGIONS)
def test_every_request_goes_where_and_is_signed_as_with_botocores_full_files(
        region: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    session = botocore.session.get_session()  # botocore's own files
    for service, operation in CALLS.items():
        full = session.create_client(service, region_name=region)
        ours = sent(make_client(service, region), operation)
        assert ours == sent(full, operation), (service, region)
        assert ours[1].startswith(("us-", "eu-", "ap-", "cn-")), ours  # signed for a region, so compared


def test_the_process_keeps_the_services_endpoints_and_models_without_their_documentation() -> None:
    make_client("kinesis", "us-east-1")
    loader = _models()
    endpoints = loader.load_data("endpoints")
    kept = {service for partition in endpoints["partitions"] for service in partition["services"]}
    assert kept == ENDPOINT_SERVICES
    full = botocore.session.get_session().get_component("data_loader").load_service_model("kinesis", "service-2")
    lean = loader.load_service_model("kinesis", "service-2")
    assert set(lean["operations"]) == set(full["operations"]) and set(lean["shapes"]) == set(full["shapes"])
    for part in ("operations", "shapes"):
        assert '"documentation"' in json.dumps(full[part]) and '"documentation"' not in json.dumps(lean[part])


def test_the_endpoint_table_is_botocores_with_the_kept_services_only() -> None:
    # Read afresh: a loader's endpoint table is cached, and botocore's endpoint resolver fills resolved entries in.
    path = str(Path(botocore.__file__).parent / "data" / "endpoints")
    full = JSONFileLoader().load_file(path)
    expected = {**full, "partitions": [{**partition, "services": {
        name: entry for name, entry in partition["services"].items() if name in ENDPOINT_SERVICES}}
        for partition in full["partitions"]]}
    lean = LeanModelFiles().load_file(path)
    assert lean == expected
    assert all(partition["services"] for partition in lean["partitions"])  # each partition keeps some


@pytest.mark.parametrize("layout", [{"indent": 2}, {"separators": (",", ":")}, {"indent": "\t"}])
def test_the_text_cut_keeps_exactly_the_kept_services_whatever_the_layout(layout: dict[str, Any]) -> None:
    entry = {"endpoints": {"us-east-1": {"hostname": "{service}.{region}.{dnsSuffix}", "tags": ["a", "}"]}}}
    services = {"aaa": entry, "kinesis": entry, "iam": {}, "sts": {"endpoints": {}}, "zzz": entry}
    partitions: list[dict[str, Any]] = [{"partition": name, "services": services, "regions": {"r": {}}}
                                        for name in ("aws", "aws-cn")]
    kept = json.loads(_kept_text(json.dumps({"partitions": partitions, "version": 3}, **layout)))
    assert kept == {"partitions": [{**partition, "services": {"kinesis": entry, "sts": {"endpoints": {}}}}
                                   for partition in partitions], "version": 3}


# Resident memory a process gains making a Kinesis and a DynamoDB client, as botocore makes them or as we do.
GROWTH = """
import sys
def rss():
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS")).split()[1]) * 1024
import botocore.session, shardherd.shared.aws
before = rss()
for service in ("kinesis", "dynamodb"):
    if sys.argv[1] == "lean":
        shardherd.shared.aws.make_client(service, "us-east-1", "http://127.0.0.1:9")
    else:
        botocore.session.get_session().create_client(service, region_name="us-east-1",
            endpoint_url="http://127.0.0.1:9", aws_access_key_id="a", aws_secret_access_key="b")
print(rss() - before)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_our_clients_cost_megabytes_less_than_botocores_in_the_same_run() -> None:
    def growth(kind: str) -> int:
        done = subprocess.run([sys.executable, "-c", GROWTH, kind], capture_output=True, text=True, check=True,
                              timeout=60)
        return int(done.stdout)

    full, lean = growth("full"), growth("lean")
    assert lean < full - 3 * 2**20, (full / 2**20, lean / 2**20)  # measured: 14.6 and 10.6 MB
