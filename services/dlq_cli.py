"""`shardherd dlq list|replay URL`: the records quarantined as poison (agent/quarantine.py), shown or put back.

`replay` puts every quarantined record back into the stream it came from (or `--to-stream`) with its partition key
(and explicit hash key), through PutRecords batches of at most 500 records and 5 MiB. Invariants:

- A record is removed from the destination only after Kinesis accepted it (its PutRecords entry has a sequence
  number); a record Kinesis refused (a per-record throttle or internal error, or the whole call throttled) is put
  again after a growing wait, and one still refused after `ROUNDS` rounds stays in the destination, the command
  failing with one line: nothing is dropped, and running it again resumes.
- A record is put back at least once: a crash between the put and the removal puts it again on the next run.
- `--dry-run` reads the destination and writes nothing.
Errors are one line and exit code 2 (services/cli.py).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from shardherd.agent.quarantine import Destination, Quarantined, open_destination
from shardherd.shared.aws import make_client
from shardherd.shared.config import load_settings
from shardherd.shared.errors import ShardherdError

MAX_RECORDS = 500  # PutRecords' limits
MAX_BYTES = 5 * 1024 * 1024
ROUNDS = 10  # puts of one batch before the records Kinesis keeps refusing are left in the destination
MAX_WAIT = 5.0
THROTTLED = "ProvisionedThroughputExceededException"


class ReplayIncomplete(ShardherdError):
    """Kinesis kept refusing some records: they stay in the destination (run the replay again)."""


def register(sub: Any) -> None:
    """Add `dlq list` and `dlq replay`."""
    dlq = sub.add_parser("dlq", help="poison records quarantined by poison_policy quarantine: list, put back")
    verbs = dlq.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("list", help="one line per quarantined record")
    listing.add_argument("url", help="file:///absolute/dir or s3://bucket/prefix")
    listing.set_defaults(run=run_list)
    replay = verbs.add_parser("replay", help="put the quarantined records back into their stream, then remove them")
    replay.add_argument("url", help="file:///absolute/dir or s3://bucket/prefix")
    replay.add_argument("--to-stream", help="put them into this stream instead of the one each came from")
    replay.add_argument("--dry-run", action="store_true", help="say what would be put where, write nothing")
    replay.set_defaults(run=run_replay)


def _destination(url: str) -> Destination:
    settings = load_settings()
    return open_destination(url, settings.region, settings.s3_endpoint_url)


def run_list(args: argparse.Namespace) -> int:
    """Print each quarantined record: its position, partition key, arrival, attempts and error."""
    destination = _destination(args.url)
    count = 0
    for name in destination.names():
        record = destination.get(name)
        count += 1
        print(f"{record.stream} {record.shard_id} {record.sequence_number}/{record.sub_sequence_number} "
              f"key={record.partition_key} arrived={record.approximate_arrival or '-'} attempts={record.attempts} "
              f"worker={record.worker_id}: {record.error}")
    print(f"{count} quarantined records in {args.url}")
    return 0


def run_replay(args: argparse.Namespace) -> int:
    """Put the records back (or with --dry-run say where they would go); one line per stream, then the total."""
    destination = _destination(args.url)
    records = [(name, destination.get(name)) for name in destination.names()]
    targets = Counter(args.to_stream or record.stream for _, record in records)
    if args.dry_run:
        for stream, count in sorted(targets.items()):
            print(f"would put {count} records back into {stream}")
        print(f"dry run: {len(records)} records, nothing written")
        return 0
    settings = load_settings()
    kinesis = make_client("kinesis", settings.region, settings.kinesis_endpoint_url)
    for stream in sorted(targets):
        mine = [(name, record) for name, record in records if (args.to_stream or record.stream) == stream]
        for batch in batches(mine):
            put_back(kinesis, stream, batch, destination.remove)
        print(f"put {targets[stream]} records back into {stream}")
    print(f"replayed {len(records)} records from {args.url}")
    return 0


def _entry(record: Quarantined) -> dict[str, Any]:
    entry: dict[str, Any] = {"Data": record.payload, "PartitionKey": record.partition_key}
    if record.explicit_hash_key is not None:
        entry["ExplicitHashKey"] = record.explicit_hash_key
    return entry


def _size(record: Quarantined) -> int:
    return len(record.payload) + len(record.partition_key.encode())


def batches(records: list[tuple[str, Quarantined]]) -> Iterator[list[tuple[str, Quarantined]]]:
    """`records` in order, cut into PutRecords batches (at most MAX_RECORDS records and MAX_BYTES)."""
    batch: list[tuple[str, Quarantined]] = []
    size = 0
    for item in records:
        if batch and (len(batch) == MAX_RECORDS or size + _size(item[1]) > MAX_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += _size(item[1])
    if batch:
        yield batch


def put_back(kinesis: Any, stream: str, batch: list[tuple[str, Quarantined]], remove: Callable[[str], None],
             sleep: Callable[[float], None] = time.sleep) -> None:
    """PutRecords `batch` into `stream`, removing each record once accepted; refused ones are put again.

    ReplayIncomplete when some are still refused after ROUNDS rounds (they stay in the destination).
    """
    from botocore.exceptions import ClientError

    left = batch
    last = ""
    for round_ in range(ROUNDS):
        if round_:
            sleep(min(MAX_WAIT, 0.2 * 2 ** (round_ - 1)))
        try:
            answer = kinesis.put_records(StreamName=stream, Records=[_entry(record) for _, record in left])
        except ClientError as exc:
            last = str(exc.response.get("Error", {}).get("Code"))
            if last != THROTTLED:
                raise
            continue
        refused = []
        for item, result in zip(left, answer["Records"], strict=True):
            if "ErrorCode" in result:
                refused.append(item)
                last = str(result["ErrorCode"])
            else:
                remove(item[0])
        left = refused
        if not left:
            return
    raise ReplayIncomplete(f"{len(left)} records Kinesis kept refusing ({last}) after {ROUNDS} rounds stay in the "
                           "destination; run the replay again")
