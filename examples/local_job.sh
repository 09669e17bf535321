#!/usr/bin/env bash
# examples/spark_job.py as one more worker of the local stack; once it wrote a batch, stopped as Ctrl-C stops it.
set -euo pipefail
shardherd up --no-spark --duration 600 > up.log 2>&1 &  # the stack: emulators, producer, 2 coordinators, 3 agents
STACK=$!
trap 'kill "$STACK" 2> /dev/null || true' EXIT          # the stack stops with this script, whatever happens
until [ -f .shardherd/up/job.env ]; do sleep 1; done    # written once the stack's processes run
set -a; . .shardherd/up/job.env; set +a                 # its application, stream, endpoints, coordinators, dummy keys
export SHARDHERD_WORKER_ID=my-job                       # the job's name in the lease table
export SPARK_LOCAL_IP=127.0.0.1                         # Spark on loopback, UI off, one local core:
export PYSPARK_SUBMIT_ARGS="--master local[1] --conf spark.ui.enabled=false --conf spark.driver.host=127.0.0.1 \
--conf spark.driver.bindAddress=127.0.0.1 pyspark-shell"
python examples/spark_job.py --output "$PWD/my-job/records" --trigger "1 second" &
JOB=$!
until ls my-job/records/*.parquet > /dev/null 2>&1; do kill -0 "$JOB"; sleep 1; done  # it reads its shards
kill -INT "$JOB"; wait "$JOB"                            # Ctrl-C: the job drains, then exits 0
kill "$STACK"; wait "$STACK"                             # stop the stack (as Ctrl-C in its terminal would)
