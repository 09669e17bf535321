"""Test-session infrastructure: real PostgreSQL and emulator processes on 127.0.0.1."""
