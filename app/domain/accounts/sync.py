"""Keep every replica's API-key index current through the ``EventBus``."""

from __future__ import annotations

import asyncio
from uuid import UUID

import structlog

from app.db.outage import is_database_outage
from app.domain.accounts.keyring import ActiveApiKey, ApiKeyIndex
from app.lib.events.base import EventBus

CHANNEL = "auth.api_keys"
logger = structlog.get_logger()


class ApiKeySync:
    def __init__(self, index: ApiKeyIndex, bus: EventBus) -> None:
        self._index = index
        self._bus = bus

    async def created(self, key_hash: str, key: ActiveApiKey) -> None:
        self._index.add(key_hash, key)
        await self._bus.publish(
            CHANNEL,
            {
                "kind": "created",
                "hash": key_hash,
                "keyId": str(key.key_id),
                "projectId": str(key.project_id),
            },
        )

    async def updated(self, key_hash: str, key: ActiveApiKey) -> None:
        """The key's governance changed (expiry, limits): this replica holds the new
        one at once; the others read the key again when the event arrives."""
        self._index.add(key_hash, key)
        await self._bus.publish(CHANNEL, {"kind": "updated", "hash": key_hash})

    async def revoked(self, key_hash: str) -> None:
        self._index.remove(key_hash)
        await self._bus.publish(CHANNEL, {"kind": "revoked", "hash": key_hash})

    async def project_deleted(self, project_id: UUID) -> None:
        self._index.remove_project(project_id)
        await self._bus.publish(CHANNEL, {"kind": "project_deleted", "projectId": str(project_id)})

    def apply(self, event: dict[str, object]) -> None:
        """Apply an event from any replica (ours included: applying twice is harmless)."""
        kind = event.get("kind")
        try:
            if kind == "created":
                self._index.add(
                    str(event["hash"]),
                    ActiveApiKey(
                        key_id=UUID(str(event["keyId"])), project_id=UUID(str(event["projectId"]))
                    ),
                )
            elif kind == "revoked":
                self._index.remove(str(event["hash"]))
            elif kind == "project_deleted":
                self._index.remove_project(UUID(str(event["projectId"])))
        except (KeyError, ValueError):
            logger.warning("ignoring malformed api key event", kind=kind)

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Follow other replicas' changes until cancelled.

        The index is (re)loaded after the subscription is in place, not before: a
        change published while loading is then queued and applied on top instead of
        falling into the gap between the two. Each restart after a lost connection
        reloads too, since events published meanwhile are gone.
        """
        async with self._bus.subscribe(CHANNEL) as events:
            try:
                await self._index.reload()
            except Exception as exc:
                if not is_database_outage(exc):
                    raise
                # Resubscribed while the database is down: keep the keys held and
                # follow events; the periodic reload catches up once it is back.
                logger.warning("api key index not reloaded: database unreachable")
            else:
                if ready is not None:
                    ready.set()
            async for event in events:
                await self.receive(event)

    async def receive(self, event: dict[str, object]) -> None:
        """``apply``, except for the kinds whose governance is read from the database
        (a new key, an update): events carry no more than the key's hash and ids, so
        a key is never held without its limits, even for a moment."""
        kind = event.get("kind")
        if kind not in ("created", "updated"):
            self.apply(event)
            return
        try:
            await self._index.refresh(str(event["hash"]), created=kind == "created")
        except KeyError:
            logger.warning("ignoring malformed api key event", kind=kind)
        except Exception as exc:
            if not is_database_outage(exc):
                raise
            logger.warning("api key update not re-read: database unreachable")
