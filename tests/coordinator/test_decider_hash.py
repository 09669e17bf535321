"""bench/decider_hash.py: the hash a refactor of the deciders is checked with depends on the plans (one fleet more
changes it; the fleets' plans differ) and not on the process's string hashing."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from bench.decider_hash import fleet, hashes, plan_text
from shardherd.coordinator.decide import decide
from shardherd.coordinator.decider_config import Strategy

ROOT = Path(__file__).resolve().parents[2]


def _run(hash_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.run([sys.executable, "-m", "bench.decider_hash", "--fleets", "150"], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True, timeout=300).stdout


def test_two_processes_with_different_string_hashing_print_the_same_hashes() -> None:
    first, second = _run("1"), _run("2")
    assert first == second
    assert [line.split(":")[0] for line in first.splitlines()[:4]] == [*(s.value for s in Strategy), "all"]


def test_the_hash_changes_with_one_plan_and_every_strategy_moves_leases() -> None:
    found, moves = hashes(40)
    assert moves > 0 and found != hashes(39)[0]
    for strategy in Strategy:
        texts = set()
        for seed in range(40):
            snapshot, config, balance = fleet(seed)
            plan = decide(snapshot, dataclasses.replace(config, strategy=strategy), balance=balance)
            texts.add(plan_text(plan))
        assert len(texts) > 30, strategy  # the fleets differ, and so do their plans
