"""A failed foreachBatch write reaches Spark as a short error that Spark's own stop classifier can read."""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING

import pytest

from shardherd.agent.spark.write_errors import MESSAGE_LIMIT, BatchWriteFailed, is_interruption, summary

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark]

CLASSIFIER = "org.apache.spark.sql.execution.streaming.runtime.StreamExecution"


def _cancelled_job_error(spark: SparkSession, frames: int) -> Exception:
    """A real Py4JJavaError whose Java side is a cancelled job caused by an interruption, with a long stack."""
    from py4j.protocol import Py4JJavaError

    jvm = spark._jvm
    assert jvm is not None
    cause = jvm.java.lang.InterruptedException("sleep interrupted")
    element = jvm.java.lang.StackTraceElement
    stack = [element("org.apache.spark.scheduler.DAGScheduler", f"runJob{index}", "DAGScheduler.scala", index)
             for index in range(frames)]
    job = jvm.org.apache.spark.SparkException("Job 7 cancelled because the query was stopped", cause)
    gateway = spark.sparkContext._gateway
    assert gateway is not None
    array = gateway.new_array(element, len(stack))
    for index, item in enumerate(stack):
        array[index] = item
    job.setStackTrace(array)
    error: Exception = Py4JJavaError("An error occurred while calling o123.save.\n", job)
    return error


def _proxy_text(exc: BaseException) -> str:
    """The text py4j hands the JVM when a Python callback raises: a fixed prefix and the formatted traceback."""
    return "An exception was raised by the Python Proxy. Return Message: " + "".join(
        traceback.format_exception(exc))


def _spark_says_interrupted(spark: SparkSession, text: str) -> bool:
    jvm = spark._jvm
    assert jvm is not None
    return bool(getattr(jvm, CLASSIFIER).isInterruptionException(jvm.py4j.Py4JException(text),
                                                                 spark.sparkContext._jsc.sc()))


def test_spark_classifies_the_short_copy_of_a_stopped_write_as_an_interruption(spark: SparkSession) -> None:
    from py4j.protocol import Py4JError

    original = _cancelled_job_error(spark, frames=120)
    with pytest.raises(Py4JError):  # the raw error's text overflows Spark's matcher (the bug this module avoids)
        _spark_says_interrupted(spark, _proxy_text(original))

    assert is_interruption(original)
    try:
        raise BatchWriteFailed(f"batch 7 not written: {summary(original)}") from None
    except BatchWriteFailed as short:
        copy = short
    text = _proxy_text(copy)
    assert len(str(copy)) <= MESSAGE_LIMIT + len("batch 7 not written: ")
    assert "java.lang.InterruptedException" in str(copy) and "o123.save" in str(copy)
    assert _spark_says_interrupted(spark, text)


def test_a_summary_keeps_the_first_line_and_every_java_name_within_the_limit() -> None:
    text = "boom: the sink refused the batch\n" + "".join(
        f"Caused by: com.example.sink.Layer{index}Exception: layer {index} failed\n\tat com.example.Sink.put\n"
        for index in range(40))
    made = summary(RuntimeError(text), limit=200)
    assert made.startswith("builtins.RuntimeError: boom: the sink refused the batch")
    assert len(made) <= 200 and made.endswith("]")
    short = summary(RuntimeError("disk full"))
    assert short == "builtins.RuntimeError: disk full"
    assert not is_interruption(RuntimeError(text))
