"""Leader election, shard sync and lease assignment (the coordination microservice's logic)."""
