"""The fleet simulator behind `python -m bench.fleet_sim`, `bench/fleet_noise.py` and `bench/fleet_cost.py`.

The real coordinator (shard sync planner, leader loop, lock, deciders) and the real agent-side components run on an
in-memory store and a virtual clock against simulated workers; one module per concern:

* `world`: the event queue that moves the virtual clock, and the stream (shards and their rates);
* `worker`: simulated workers: shardherd agents running the agent's own keeper and metrics, and a KCL 2.x model;
* `noise`: the live stack's measurement noise and lag, optional;
* `model`: a fleet of one variant (store, leader, workers) and the owner-change counter;
* `measures`: balance ratios, the balance bound, the fewest moves that reach it;
* `scenarios`: the benchmark's scenarios, run one variant at a time into `Result`s;
* `report`: the printed table and targets.
"""
