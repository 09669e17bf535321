"""bench.churn follows a joining agent until its first heartbeat and `--settle` seconds past it.

Live (session 26, `python -m bench.churn --spark --scenario add-agent --settle 60 --window 300`): the new Spark
driver's first row came about 63 s after the action, its JVM starting first. The bench stopped following at 60 s, so it
printed no heartbeat and no timings, while the leader filled the driver in the run that first saw its row.
"""

from __future__ import annotations

from bench.churn import START_TIMEOUT, following


def test_a_joiner_is_followed_until_its_first_heartbeat_even_past_the_settle_seconds() -> None:
    assert following(63.0, None, 60.0)
    assert following(START_TIMEOUT - 1.0, None, 60.0)
    assert not following(START_TIMEOUT, None, 60.0)  # an agent that never heartbeats is not waited for forever


def test_a_joiner_is_followed_for_the_settle_seconds_past_its_first_heartbeat() -> None:
    assert following(63.0 + 59.0, 63.0, 60.0)
    assert not following(63.0 + 60.0, 63.0, 60.0)
    assert not following(5.0 + 60.0, 5.0, 60.0)  # a plain agent heartbeats within seconds: its follow ends as before
