"""Assignment strategies behind one protocol (`protocol.Decider`), as sibling modules.

* `band`: shardherd's default: every worker back inside the band in one run with few moves (band.py, band_moves.py).
* `kcl_variance`: KCL 3.x's variance decider with dampened donor budgets.
* `lease_count`: KCL's lease-count strategy (floor(n/w) or floor(n/w)+1 leases each), metrics ignored.

`fleet_state` holds what the two metric-driven strategies share (values, catch-up, placement, projections) and
`worker_metrics` how a worker's metric history is read. coordinator/decide.py chooses a strategy by name.
"""
