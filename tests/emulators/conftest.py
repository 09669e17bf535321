"""Kinesis emulator fixtures for the emulator tests, shared with the coordinator tests (one process per session)."""

from tests.coordinator.conftest import kinesalite  # noqa: F401
