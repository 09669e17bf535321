"""Spark integration: the `shardherd` streaming source, the agent embedded in the driver, checkpointing sink."""
