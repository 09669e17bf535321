"""bench/rolling_restart.py's per-shard measure: a shard's unread time at its agent's restart, apart from the rest."""

from bench.rolling_restart import Pass, Restart, per_shard, restart_overrun


def _pass(gaps: dict[str, list[tuple[float, float]]], restarts: list[Restart]) -> Pass:
    figures = Pass("reservations", restarts=restarts)
    figures.gaps.update(gaps)
    return figures


def test_only_the_stretch_at_the_restart_counts_against_it() -> None:
    # shard a: 6 s unread across its agent's 5 s restart at t=100, and a 4 s stretch at t=300 (another agent's turn)
    # shard b: read through the restart of the agent that held it (0 unread at it), 5 s unread at t=200
    figures = _pass({"a": [(99.5, 105.5), (300.0, 304.0)], "b": [(200.0, 205.0)]},
                    [Restart(100.0, 5.0, ("a", "b"))])
    over, apart = restart_overrun(figures)
    assert over == [1.0, -5.0]
    assert sorted(apart) == [(200.0, 205.0), (300.0, 304.0)]
    assert "max 1.0 s" in per_shard(figures) and "2 stretches, 9.0 shard-seconds" in per_shard(figures)


def test_a_stretch_that_began_before_sigterm_and_ends_after_it_counts_whole() -> None:
    figures = _pass({"a": [(90.0, 106.0)]}, [Restart(100.0, 5.0, ("a",))])
    assert restart_overrun(figures) == ([11.0], [])
