"""The row schema of the `shardherd` source: one row per user record (KPL aggregates expanded).

| column              | type      | meaning                                                                 |
| ------------------- | --------- | ----------------------------------------------------------------------- |
| shard_id            | STRING    | the Kinesis shard the record was read from                              |
| sequence_number     | STRING    | Kinesis sequence number (up to 129 digits: kept as a string)            |
| sub_sequence_number | BIGINT    | index of the user record inside a KPL aggregate (0 when not aggregated) |
| partition_key       | STRING    | the user record's partition key                                         |
| arrival_timestamp   | TIMESTAMP | ApproximateArrivalTimestamp of the Kinesis record (UTC)                 |
| data                | BINARY    | the payload                                                             |
| stream_name         | STRING    | the Kinesis stream (several in a multi-stream application)              |
| reader_pid          | INT       | only with option `includeReader=true`: pid of the process that read it  |

(stream_name, shard_id, sequence_number, sub_sequence_number) identifies a record: sinks dedupe or MERGE on it
(shard ids repeat across streams; within one stream the last three suffice).
"""

from __future__ import annotations

COLUMNS = ("shard_id", "sequence_number", "sub_sequence_number", "partition_key", "arrival_timestamp", "data",
           "stream_name")
DDL = ("shard_id STRING, sequence_number STRING, sub_sequence_number BIGINT, partition_key STRING, "
       "arrival_timestamp TIMESTAMP, data BINARY, stream_name STRING")
READER_DDL = DDL + ", reader_pid INT"



def schema_ddl(include_reader: bool) -> str:
    """The schema as a Spark DDL string, with the diagnostic `reader_pid` column if asked."""
    return READER_DDL if include_reader else DDL
