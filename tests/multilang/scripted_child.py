"""A minimal MultiLang child written from the protocol alone (no amazon_kclpy), scripted by MULTILANG_SCRIPT.

Script words: `noise` (print a non-message line and a stderr line at start), `checkpoint-in-init` (ask for a
checkpoint while initializing), `hang-once` (sleep on the first processRecords of the first run), `wrong-status`
(answer processRecords with the status of another action), `stop-reading` (stop reading stdin after initialize),
`poison` (exit on a batch holding a record whose data is `poison`), `checkpoint-batches` (checkpoint each batch
without a position, as kclpy's `checkpoint()` does).
Every message received and every checkpoint answer is
appended to MULTILANG_TRACE as a JSON line.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path

SCRIPT = set(os.environ.get("MULTILANG_SCRIPT", "").split(","))
TRACE = Path(os.environ["MULTILANG_TRACE"])


def trace(message: dict[str, object]) -> None:
    with TRACE.open("a", encoding="utf-8") as out:
        out.write(json.dumps(message) + "\n")


def send(message: dict[str, object]) -> None:
    sys.stdout.write("\n" + json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    first_run = not Path(str(TRACE) + ".ran").exists()
    Path(str(TRACE) + ".ran").touch()
    if "noise" in SCRIPT:
        print("hello from the processor's stdout", flush=True)
        sys.stderr.write("a line on stderr\npartial without newline")
        sys.stderr.flush()
    for line in sys.stdin:
        message = json.loads(line)
        trace(message)
        action = message["action"]
        if action == "initialize" and "checkpoint-in-init" in SCRIPT:
            send({"action": "checkpoint", "sequenceNumber": None, "subSequenceNumber": None})
            trace(json.loads(sys.stdin.readline()))
        if action == "processRecords" and "hang-once" in SCRIPT and first_run:
            time.sleep(60)
        if action == "processRecords" and "poison" in SCRIPT and any(
                base64.b64decode(record["data"]) == b"poison" for record in message["records"]):
            sys.exit(3)
        if action == "processRecords" and "checkpoint-batches" in SCRIPT:
            send({"action": "checkpoint", "sequenceNumber": None, "subSequenceNumber": None})
            trace(json.loads(sys.stdin.readline()))
        if action == "processRecords" and "wrong-status" in SCRIPT:
            send({"action": "status", "responseFor": "initialize"})
            continue
        send({"action": "status", "responseFor": action})
        if action == "initialize" and "stop-reading" in SCRIPT:
            time.sleep(60)


if __name__ == "__main__":
    main()
