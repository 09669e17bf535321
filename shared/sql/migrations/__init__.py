"""Alembic migrations of the SQL store's tables (one version table per application): shared/sql/migrate.py runs them."""
