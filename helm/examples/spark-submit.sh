#!/bin/bash
# Submits a PySpark job whose driver embeds the shardherd agent (cluster mode on EKS).
# Image: built from Dockerfile.agent; driver-pod-template.yaml adds the shardherd config, token and preStop drain.
set -euo pipefail

API_SERVER="${API_SERVER:?set API_SERVER to the EKS API endpoint, e.g. https://ABCD.gr7.us-east-1.eks.amazonaws.com}"
IMAGE="${IMAGE:-123456789012.dkr.ecr.us-east-1.amazonaws.com/shardherd-spark:0.1.0}"

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
  local:///opt/app/orders_job.py
