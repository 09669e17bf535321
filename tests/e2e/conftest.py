"""Kinesis emulator fixtures for end-to-end tests (shared with the coordinator tests)."""

from tests.coordinator.conftest import kinesalite  # noqa: F401
