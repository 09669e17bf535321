#!/usr/bin/env bash
# The poison records an agent quarantined under DLQ_URL (poison_policy = "quarantine"): list them, see where a replay
# would put them, then put them back into the streams they came from (each removed once Kinesis took it).
set -euo pipefail
shardherd dlq list "$DLQ_URL"
shardherd dlq replay "$DLQ_URL" --dry-run
shardherd dlq replay "$DLQ_URL"
