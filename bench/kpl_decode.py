"""Decode CPU per user record: the protobuf runtime's C decoder vs the pure-Python one, same aggregates, same run.

    python -m bench.kpl_decode [--rounds 7] [--seconds 0.5]

Aggregates of 100-byte and 1 KiB user records, 10 per aggregate (bench/spark_read_cost.py's shape) and full ones
(the KPL's 51,200-byte default), partition keys from a small pool; text payloads, and binary ones with some explicit
hash keys. Each round times both
decoders back to back (process CPU time): `decode` of each (user record objects) and the protobuf
decoder's `decode_columns` (partition keys and payloads only, what the Spark read path takes); medians and ratios
to the pure-Python decoder are printed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import string
import time
from collections.abc import Callable

from shardherd.agent import kpl_protobuf, kpl_python
from shardherd.agent.kpl import Aggregator, UserRecord

Decoder = Callable[[bytes], object]


def aggregates(size: int, per_aggregate: int | None, text: bool, rng: random.Random) -> tuple[list[bytes], int]:
    """Aggregates of `size`-byte records (`per_aggregate` each, or as many as fit) and their user record count.

    Text records are JSON-like ASCII without explicit hash keys (the usual producer); binary ones are random bytes,
    a quarter with explicit hash keys (the protobuf column decoder then checks every record's optional fields).
    """
    alphabet = string.ascii_letters + string.digits + '{}":, '
    records = [UserRecord(f"key-{rng.randrange(50)}", "".join(rng.choices(alphabet, k=size)).encode())
               if text else UserRecord(f"key-{rng.randrange(50)}", rng.randbytes(size),
                                       str(rng.getrandbits(128)) if index % 4 == 0 else None)
               for index in range(2_000)]
    packer = Aggregator(max_records=per_aggregate) if per_aggregate else Aggregator()
    packed = packer.pack(records)
    return [aggregate.data for aggregate in packed], len(records)


def cpu_per_record(decode: Decoder, data: list[bytes], records: int, seconds: float) -> float:
    """Process CPU seconds per user record, decoding `data` repeatedly for about `seconds`."""
    loops = 0
    started = time.process_time()
    while True:
        for item in data:
            decode(item)
        loops += 1
        spent = time.process_time() - started
        if spent >= seconds:
            return spent / (loops * records)


def main() -> None:
    parser = argparse.ArgumentParser(description="KPL decode CPU per user record, protobuf (upb) vs pure Python")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5, help="CPU time per decoder per round")
    args = parser.parse_args()
    print(f"protobuf runtime: {kpl_protobuf.implementation()}; median of {args.rounds} rounds, process CPU")
    rng = random.Random(16)
    for size, per_aggregate, text in ((100, 10, True), (100, None, True), (100, 10, False), (1024, 10, True),
                                      (1024, None, True), (1024, 10, False)):
        data, records = aggregates(size, per_aggregate, text, rng)
        assert all(kpl_protobuf.decode(item) == kpl_python.decode(item) for item in data)
        samples: dict[str, list[float]] = {"python": [], "protobuf": [], "columns": []}
        for _ in range(args.rounds):
            for name, decode in (("python", kpl_python.decode), ("protobuf", kpl_protobuf.decode),
                                 ("columns", kpl_protobuf.decode_columns)):
                samples[name].append(cpu_per_record(decode, data, records, args.seconds))
        pure, fast, columns = (statistics.median(samples[name]) for name in ("python", "protobuf", "columns"))
        shape = f"{'text' if text else 'binary'}, {records / len(data):.0f} per aggregate"
        print(f"{size:5d} B {shape:>25}: python {pure * 1e6:5.2f} us, protobuf {fast * 1e6:5.2f} us "
              f"({pure / fast:.1f}x less CPU), protobuf columns (Spark path) {columns * 1e6:5.2f} us "
              f"({pure / columns:.1f}x) per user record")


if __name__ == "__main__":
    main()
