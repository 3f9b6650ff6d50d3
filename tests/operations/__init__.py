"""Production operation: database outages, the CLI, retries, records, Alembic, logging."""
