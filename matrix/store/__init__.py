"""The results store: schema (models), engine and sessions (db), export/ingest/merge."""
