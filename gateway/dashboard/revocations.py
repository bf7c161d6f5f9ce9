"""Server-side sign-out: a signed-out session's id goes to the ``revoked_sessions`` table, which
every replica checks on every dashboard request, so a copied cookie is dead everywhere at once.
Rows outlive nothing: one is pruned once its session would have expired anyway."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite

from gateway.dashboard.sessions import SessionData
from gateway.db.engine import Database
from gateway.db.models import RevokedSession


class Revocations:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def revoke(self, session: SessionData) -> None:
        now = datetime.now(UTC)
        insert = (postgresql if self.db.dialect == "postgresql" else sqlite).insert(RevokedSession)
        row = {"session_id": session.nonce, "expires_at": datetime.fromtimestamp(session.expires, UTC)}
        async with self.db.session() as s:
            await s.execute(delete(RevokedSession).where(RevokedSession.expires_at < now))
            await s.execute(insert.values(row).on_conflict_do_nothing(index_elements=["session_id"]))
            await s.commit()

    async def is_revoked(self, session: SessionData) -> bool:
        query = select(RevokedSession.session_id).where(RevokedSession.session_id == session.nonce)
        async with self.db.session() as s:
            return (await s.scalar(query)) is not None
