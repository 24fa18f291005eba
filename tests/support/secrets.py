"""Fixtures and helpers for the secrets API and ``arona vault rotate`` tests.

Custom LLMs and override keys have no API here yet: the tests that need rows in
those tables insert them directly, sealed with the aad helpers the other areas use.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

import httpx
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.config import build_db_config, install_sqlite_pragmas
from app.db.models import CustomLlm, OverrideKey, ProjectSecret
from app.domain.secrets.aad import custom_llm_aad, override_key_aad
from app.lib.settings import Settings, VaultKey, load_settings
from app.lib.vault import Vault, generate_key_spec
from tests.support.api import Client, settings_of
from tests.support.conversations import ADMIN, ADMIN_TOKEN
from tests.support.settings import AppFactory, with_settings

__all__ = ["ADMIN", "ADMIN_TOKEN"]

SECRET_FIELDS = {"id", "name", "description", "hint", "createdAt", "rotatedAt", "usedBy"}
MISSING = "00000000-0000-4000-8000-000000000000"


def new_key(kid: str) -> VaultKey:
    """A fresh random master key (every call differs, even for the same kid)."""
    return load_settings({"ARONA_VAULT_KEYS": generate_key_spec(kid)}).vault_keys[0]


def plaintext(tag: str = "sk") -> str:
    """A value unlikely to appear anywhere by accident."""
    return f"{tag}-live-{uuid.uuid4().hex}{uuid.uuid4().hex}"


@pytest.fixture(params=["postgres", "sqlite"])
async def secrets_client(
    request: pytest.FixtureRequest,
    make_app: AppFactory,
    pg_settings: Settings,
    sqlite_settings: Settings,
) -> AsyncIterator[Client]:
    """Both databases, with an operator admin token."""
    settings = pg_settings if request.param == "postgres" else sqlite_settings
    app = make_app(with_settings(settings, admin_token=ADMIN_TOKEN))
    async with AsyncTestClient(app=app) as client:
        yield client


def base(project_id: str) -> str:
    return f"/api/projects/{project_id}/secrets"


async def create_secret(
    client: Client | httpx.AsyncClient, project_id: str, headers: dict[str, str], **body: Any
) -> dict[str, Any]:
    body.setdefault("name", f"s-{uuid.uuid4().hex[:10]}")
    body.setdefault("value", plaintext())
    response = await client.post(base(project_id), json=body, headers=headers)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


@asynccontextmanager
async def engine_for(settings: Settings) -> AsyncIterator[AsyncEngine]:
    """An engine on the test's own event loop (the app has its own)."""
    engine = build_db_config(settings).get_engine()
    install_sqlite_pragmas(engine)
    try:
        yield engine
    finally:
        await engine.dispose()


@asynccontextmanager
async def client_engine(client: Client) -> AsyncIterator[AsyncEngine]:
    async with engine_for(settings_of(client)) as engine:
        yield engine


async def stored_token(engine: AsyncEngine, secret_id: str | UUID) -> str:
    async with engine.connect() as conn:
        token = await conn.scalar(
            select(ProjectSecret.value_encrypted).where(ProjectSecret.id == UUID(str(secret_id)))
        )
    assert isinstance(token, str)
    return token


async def add_custom_llm(
    engine: AsyncEngine,
    project_id: str | UUID,
    *,
    name: str | None = None,
    secret_id: str | UUID | None = None,
    api_key: str | None = None,
    vault: Vault | None = None,
) -> UUID:
    """A custom LLM row, as the custom LLM area would write it."""
    row_id = uuid.uuid4()
    pid = UUID(str(project_id))
    encrypted = None
    if api_key is not None:
        assert vault is not None
        encrypted = vault.encrypt(api_key, custom_llm_aad(pid, row_id))
    async with engine.begin() as conn:
        await conn.execute(
            CustomLlm.__table__.insert().values(  # type: ignore[attr-defined]
                id=row_id,
                project_id=pid,
                name=name or f"llm-{uuid.uuid4().hex[:8]}",
                template="custom",
                base_url="https://llm.example.com/v1",
                model="m",
                auth_scheme="bearer",
                provider="openai",
                max_input_tokens=1000,
                max_output_tokens=100,
                enabled=True,
                secret_id=None if secret_id is None else UUID(str(secret_id)),
                api_key_encrypted=encrypted,
                api_key_hint=None,
            )
        )
    return row_id


async def remove_custom_llm(engine: AsyncEngine, row_id: UUID) -> None:
    async with engine.begin() as conn:
        await conn.execute(delete(CustomLlm).where(CustomLlm.id == row_id))


async def add_override_key(
    engine: AsyncEngine, project_id: str | UUID, api_key: str, vault: Vault
) -> UUID:
    row_id = uuid.uuid4()
    pid = UUID(str(project_id))
    async with engine.begin() as conn:
        await conn.execute(
            OverrideKey.__table__.insert().values(  # type: ignore[attr-defined]
                id=row_id,
                project_id=pid,
                conversation_id=f"c-{uuid.uuid4().hex[:8]}",
                model_prefix="gpt-",
                key_encrypted=vault.encrypt(api_key, override_key_aad(pid, row_id)),
                key_hint="••••",
            )
        )
    return row_id
