"""What talks SQL, shared by the sink (writes) and the store (reads).

- :mod:`eventguard.sql.engine`: database URLs and engines, SQLite and PostgreSQL told apart once
- :mod:`eventguard.sql.tables`: the schema as SQLAlchemy Core tables
- :mod:`eventguard.sql.migrate`: the shipped Alembic migrations, driven from code
- :mod:`eventguard.sql.classify`: what a failed write means (refused content, or no database)
- :mod:`eventguard.sql.storable`: what a string must be before it reaches a column (ids, text, JSON)

Nothing is imported here: each module is imported by name, so loading one loads no other.
"""

__all__ = ["classify", "engine", "migrate", "storable", "tables"]
