#!/bin/bash
# Submits the example job the agent image ships (examples/spark_job.py at /opt/app/spark_job.py), whose driver
# embeds the shardherd agent, in cluster mode on EKS. One submission = one Spark application = one shardherd worker
# (docs/spark.md). Image: built from Dockerfile.agent; driver-pod-template.yaml adds the shardherd config, token and
# preStop drain.
# Without OUTPUT the job logs per-shard counts per batch (no connector jar needed). With OUTPUT=s3a://bucket/prefix
# it appends Parquet there: hadoop-aws (the version of the image's Hadoop jars) is fetched from Maven Central at
# submit time and S3A takes the IRSA web identity credentials of the pods' service account.
set -euo pipefail

API_SERVER="${API_SERVER:?set API_SERVER to the EKS API endpoint, e.g. https://ABCD.gr7.us-east-1.eks.amazonaws.com}"
IMAGE="${IMAGE:-123456789012.dkr.ecr.us-east-1.amazonaws.com/shardherd-spark:0.1.0}"
OUTPUT="${OUTPUT:-}"
HADOOP_AWS_VERSION="${HADOOP_AWS_VERSION:-3.5.0}"

sink_conf=()
job_args=()
if [[ -n "${OUTPUT}" ]]; then
  sink_conf=(
    --conf "spark.jars.packages=org.apache.hadoop:hadoop-aws:${HADOOP_AWS_VERSION}"
    --conf spark.jars.ivy=/tmp/.ivy2
    --conf spark.hadoop.fs.s3a.aws.credentials.provider=software.amazon.awssdk.auth.credentials.WebIdentityTokenFileCredentialsProvider
  )
  job_args=(--output "${OUTPUT}")
fi

spark-submit \
  --master "k8s://${API_SERVER}" \
  --deploy-mode cluster \
  --name orders-consumer \
  --conf spark.kubernetes.namespace=spark-jobs \
  --conf spark.kubernetes.container.image="${IMAGE}" \
  --conf spark.kubernetes.authenticate.driver.serviceAccountName=spark-orders-consumer \
  --conf spark.kubernetes.driver.podTemplateFile=driver-pod-template.yaml \
  --conf spark.kubernetes.driver.label.shardherd.io/client=true \
  --conf spark.kubernetes.executor.label.shardherd.io/client=true \
  --conf spark.executor.instances=2 \
  --conf spark.pyspark.python=/opt/shardherd/bin/python \
  --conf spark.kubernetes.executorEnv.SHARDHERD_REGION=us-east-1 \
  "${sink_conf[@]}" \
  local:///opt/app/spark_job.py "${job_args[@]}"
