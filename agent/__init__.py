"""The thin worker agent: metrics, lease discovery, liveness, shard reading, checkpoints and Spark hand-off."""
