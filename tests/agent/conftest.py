"""Kinesis emulator fixtures for agent tests, shared with the coordinator tests (one process each per session)."""

from tests.coordinator.conftest import kinesalite, kinesis_local  # noqa: F401
