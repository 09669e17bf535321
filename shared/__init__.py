"""Lease and worker models, table schemas, stores and configuration shared by every shardherd process."""
