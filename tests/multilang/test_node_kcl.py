"""The Node.js KCL (npm package aws-kcl, installed here, not committed) under `shardherd multilang`: the protocol is
the daemon's, not amazon_kclpy's."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.multilang.stack import REPOSITORY, MultiLangStack, all_seen
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.dynamodb, pytest.mark.timeout(150)]

NODE_KCL = "aws-kcl@2.3.2"
# What npm says when it cannot reach the registry: no network, or (a TLS-intercepting proxy whose CA this process
# lacks) no trusted connection.
UNREACHABLE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "ENETUNREACH", "network",
               "SELF_SIGNED_CERT_IN_CHAIN", "UNABLE_TO_GET_ISSUER_CERT", "UNABLE_TO_VERIFY_LEAF_SIGNATURE")
# One attempt per request: npm's own retries with backoff waited out the whole 100 s where the registry fails.
FETCH = ("--fetch-retries=0", "--fetch-timeout=20000")


def install_node_kcl(into: Path) -> Path:
    """`npm install aws-kcl` into `into` (no install scripts: they fetch jars the Node KCL's own daemon needs).

    The registry is asked for the package first, and each request is tried once: where the registry does not answer
    or cannot be trusted (CI waited out the whole install's 100 s there, npm retrying) the test skips after seconds.
    """
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("Node.js and npm are not installed")
    _npm([npm, "view", NODE_KCL, "version", *FETCH], 30)
    _npm([npm, "install", "--ignore-scripts", "--no-audit", "--no-fund", *FETCH, "--prefix", str(into), NODE_KCL], 100)
    return into / "node_modules"


def _npm(argv: list[str], timeout: float) -> None:
    """Run npm; skip the test if the registry does not answer within `timeout` s or is unreachable, else fail."""
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.skip(f"the npm registry did not answer `npm {argv[1]}` within {timeout:g} s")
    if result.returncode != 0:
        output = result.stdout + result.stderr
        said = [line for line in output.splitlines() if any(sign in line for sign in UNREACHABLE)]
        if said:
            pytest.skip(f"the npm registry is unreachable: {said[0].strip()}")
        raise AssertionError(output)


def test_a_node_kcl_processor_runs_under_shardherd_multilang(two_shards: MultiLangStack, tmp_path: Path) -> None:
    stack = two_shards
    modules = install_node_kcl(tmp_path / "node")
    app = REPOSITORY / "tests" / "multilang" / "node_app.js"
    properties = stack.properties("node.properties", executableName=f"node {app}", processingLanguage="nodejs")
    payloads = stack.produce(30, "n")
    stack.start("node-1", properties, NODE_PATH=str(modules))
    wait_for(lambda: all_seen(stack, payloads), 60, "every record processed by the Node processors")
    expected = stack.last_sequences(payloads)
    wait_for(lambda: stack.checkpoints() == expected, 10, "the Node processors' checkpoints")
    assert sorted(n for n in stack.notes() if "initialize" in n) == sorted(
        f"{shard} initialize TRIM_HORIZON node" for shard in expected)
    assert stack.end("node-1") == 0
    assert sum(n.endswith("shutdownRequested node") for n in stack.notes()) == len(expected)
    assert max(stack.delivered().values()) == 1
