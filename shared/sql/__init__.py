"""The SQL lease store: SQLite (embedded default) and PostgreSQL through SQLAlchemy Core, same contract as DynamoDB."""
