"""The per-batch timing line of the stack's drivers (agent/spark/progress_log.py)."""

from __future__ import annotations

from shardherd.agent.spark.progress_log import phase_line


def test_phase_line_names_each_phase_and_what_none_accounts_for() -> None:
    durations = {"triggerExecution": 1500, "latestOffset": 5, "queryPlanning": 20, "walCommit": 100,
                 "addBatch": 1200, "commitOffsets": 80, "getBatch": 0}
    line = phase_line(7, 420, durations)
    assert line == ("batch 7: 420 rows in 1500 ms (latestOffset 5, queryPlanning 20, walCommit 100, addBatch 1200, "
                    "commitOffsets 80, other 95)")


def test_phase_line_leaves_out_phases_spark_did_not_report() -> None:
    line = phase_line(0, 3, {"triggerExecution": 50, "addBatch": 40})
    assert line == "batch 0: 3 rows in 50 ms (addBatch 40, other 10)"
