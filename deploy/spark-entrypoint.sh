#!/bin/bash
# Entrypoint of the shardherd Spark image (Dockerfile.agent).
# Spark on Kubernetes starts driver pods as `<entrypoint> driver <spark-submit args>` and executor pods as
# `<entrypoint> executor` with the executor's settings in SPARK_* variables; any other command runs unchanged
# (`python job.py`, `shardherd ...`, `bash`).
set -euo pipefail

run_driver() {
  local bind="${SPARK_DRIVER_BIND_ADDRESS:?SPARK_DRIVER_BIND_ADDRESS is set by Spark for driver pods}"
  exec "${SPARK_HOME}/bin/spark-submit" \
    --conf "spark.driver.bindAddress=${bind}" \
    --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${bind}" \
    --deploy-mode client \
    "$@"
}

run_executor() {
  # Spark passes the executor JVM options as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ... in order.
  local -a jvm_options=()
  local index=0
  local name="SPARK_JAVA_OPT_${index}"
  while [[ -n "${!name+set}" ]]; do
    jvm_options+=("${!name}")
    index=$((index + 1))
    name="SPARK_JAVA_OPT_${index}"
  done
  local memory="${SPARK_EXECUTOR_MEMORY:?SPARK_EXECUTOR_MEMORY is set by Spark for executor pods}"
  exec "${JAVA_HOME}/bin/java" "${jvm_options[@]}" "-Xms${memory}" "-Xmx${memory}" \
    -cp "${SPARK_CLASSPATH:+${SPARK_CLASSPATH}:}${SPARK_HOME}/jars/*" \
    org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
    --driver-url "${SPARK_DRIVER_URL}" \
    --executor-id "${SPARK_EXECUTOR_ID}" \
    --cores "${SPARK_EXECUTOR_CORES}" \
    --app-id "${SPARK_APPLICATION_ID}" \
    --hostname "${SPARK_EXECUTOR_POD_IP}" \
    --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
    --podName "${SPARK_EXECUTOR_POD_NAME}"
}

case "${1:-}" in
  driver)
    shift
    run_driver "$@"
    ;;
  executor)
    shift
    run_executor
    ;;
  "")
    echo "usage: driver <spark-submit args> | executor | <command> [args]" >&2
    exit 64
    ;;
  *)
    exec "$@"
    ;;
esac
