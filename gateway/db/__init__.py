"""SQL persistence: ORM models, the async engine/session factory, and Alembic migrations."""

from gateway.db.engine import Database, make_engine, normalise_url, safe_url
from gateway.db.migrate import SchemaNotReady, check_schema

__all__ = ["Database", "SchemaNotReady", "check_schema", "make_engine", "normalise_url", "safe_url"]
