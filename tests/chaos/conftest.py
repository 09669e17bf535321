"""Emulator fixtures for the chaos tests (kinesalite; moto comes from tests/conftest.py)."""

from tests.coordinator.conftest import kinesalite  # noqa: F401
