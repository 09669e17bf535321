"""amazon-kclpy's own sample application, from its source distribution on the package registry, run unmodified.

The sdist is downloaded here (not committed); its `sample.properties` is pointed at the emulators (stream, application
and the two endpoints: the lines a user changes) and `sample_kclpy_app.py` is run as it ships, by the command
docs/migrate-from-kcl.md shows, in the samples directory.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.moto_server import MotoServer
from tests.multilang.stack import REPOSITORY, MultiLangStack
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.dynamodb, pytest.mark.timeout(180)]

UNREACHABLE = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
               "Network is unreachable", "ConnectionError", "ProxyError", "timed out")


def doc_command() -> list[str]:
    """The command docs/migrate-from-kcl.md's "From amazon-kclpy" section shows."""
    text = (REPOSITORY / "docs" / "migrate-from-kcl.md").read_text()
    section = text.split("## From amazon-kclpy", 1)[1]
    match = re.search(r"```sh\n(shardherd multilang [^\n]*)\n```", section)
    assert match is not None
    return shlex.split(match.group(1))


def download_samples(into: Path) -> Path:
    """Download the amazon_kclpy sdist and extract its samples directory; skip only if the registry is unreachable."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
         "amazon_kclpy", "-d",
         str(into)], capture_output=True, text=True, timeout=150)
    if result.returncode != 0:
        output = result.stdout + result.stderr
        if any(sign in output for sign in UNREACHABLE):
            pytest.skip(f"the package registry is unreachable: {output.strip().splitlines()[-1]}")
        raise AssertionError(output)
    (sdist,) = into.glob("amazon_kclpy-*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if "/samples/" in m.name]
        if hasattr(tarfile, "data_filter"):  # extraction filters: Python 3.11.4 and later
            archive.extractall(into, members=members, filter="data")
        else:
            archive.extractall(into, members=members)  # the members are the sdist's samples only
    (samples,) = into.glob("amazon_kclpy-*/samples")
    return samples


def point_at_emulators(properties: Path, stack: MultiLangStack) -> None:
    """Change the stream, application and endpoints of the shipped sample.properties; keep every other line."""
    replaced = {"streamName": stack.app, "streamArn": f"arn:aws:kinesis:us-east-1:000000000000:stream/{stack.app}",
                "applicationName": stack.app}
    lines = []
    for line in properties.read_text().splitlines():
        key = line.split("=", 1)[0].strip()
        lines.append(f"{key} = {replaced[key]}" if key in replaced and not line.startswith("#") else line)
    lines += [f"kinesisEndpoint = {stack.kinesis_url}", f"dynamoDBEndpoint = {stack.moto_url}"]
    properties.write_text("\n".join(lines) + "\n")


def test_the_amazon_kclpy_sample_runs_unmodified(moto_server: MotoServer, kinesalite: NodeEmulator,
                                                  tmp_path: Path) -> None:
    samples = download_samples(tmp_path / "sdist")
    shipped = (samples / "sample_kclpy_app.py").read_bytes()
    stack = MultiLangStack(moto_server.endpoint_url, kinesalite.endpoint_url, tmp_path, shards=2)
    try:
        point_at_emulators(samples / "sample.properties", stack)
        payloads = stack.produce(30, "sample")
        command = doc_command()
        assert command[-1] == "sample.properties"
        assert " ".join(command) in " ".join((REPOSITORY / "README.md").read_text().split())  # the README's too
        log = open(tmp_path / "sample.log", "wb")  # noqa: SIM115 (closed below)
        venv_bin = str(Path(sys.executable).parent)
        env = {**stack.env("sample"), "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}"}
        process = subprocess.Popen(command, cwd=samples, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        stack.workers["sample"] = process
        expected = stack.last_sequences(payloads)
        # The sample checkpoints its largest sequence number on its first batch, then every 30 s.
        wait_for(lambda: set(stack.checkpoints()) == set(expected)
                 and all(c.isdigit() for c in stack.checkpoints().values()), 60, "the sample's first checkpoints")
        process.terminate()  # drain: the sample checkpoints on shutdownRequested
        assert process.wait(40) == 0
        log.close()
        assert stack.checkpoints() == expected, stack.log("sample")[-3000:]
        output = stack.log("sample")
        assert "Record (Partition Key: sample-" in output  # the sample's stderr, forwarded to the log
        assert "Shutdown has been requested, checkpointing." in output
        assert (samples / "sample_kclpy_app.py").read_bytes() == shipped
    finally:
        stack.close()
