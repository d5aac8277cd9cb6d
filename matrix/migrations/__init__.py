"""Alembic migrations of the results store (see matrix/store/db.py for how they are applied)."""
