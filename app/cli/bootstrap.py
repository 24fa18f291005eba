"""Operator tasks behind the CLI: create an admin, prepare the demo installation."""

from __future__ import annotations

import datetime
import json
import os
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from advanced_alchemy.config.asyncio import SQLAlchemyAsyncConfig
from sqlalchemy import select

from app.db.config import build_db_config
from app.db.models import ApiKey, Project, RuntimeToken, User
from app.db.models.prices import ModelPrice
from app.db.models.profiles import ModelProfile
from app.domain.accounts.credential_services import ApiKeyService, RuntimeTokenService
from app.domain.accounts.services import RUNTIME_AUDIENCE, UserService, normalize_email
from app.domain.backends.schemas import ValidRegistration
from app.domain.backends.services import BackendConfigService
from app.domain.projects.services import ProjectService
from app.lib.hashing import sha256_hex
from app.lib.passwords import PasswordHasher
from app.lib.settings import Settings
from app.lib.tokens import TokenError, TokenService
from app.lib.vault import Vault, generate_key_spec

DEMO_ADMIN_EMAIL = "admin@demo.arona.local"
DEMO_BACKEND = "demo-upstream"
DEMO_CHAT_MODEL = "demo-chat"
DEMO_EMBEDDING_MODEL = "demo-embed"
DEMO_PROJECT_SLUG = "demo"
DEMO_FILE = "demo.json"
DEMO_POOL_FILE = "vllm-backends.json"
"""Written into the data dir and seeded at start-up like any operator's file."""
DEMO_POOL_MODEL = "demo-llama"
DEMO_ENGINE = "demo-engine"
DEMO_ENGINE_MODEL = "demo-echo"
"""Served by the bundled reference CEP engine (``arona engine-echo``)."""
DEMO_ENGINE_EMBEDDING_MODEL = "demo-echo-embed"
RUNTIME_TOKEN_MIN_REMAINING_SECONDS = 24 * 3600
"""A stored demo runtime token closer than this to expiry is replaced."""


@dataclass(frozen=True, slots=True)
class DemoCredentials:
    admin_email: str
    admin_password: str
    project_id: str
    api_key: str
    runtime_token: str


@dataclass(frozen=True, slots=True)
class PoolMember:
    """One fake vLLM server of the demo pool and the load its ``/metrics`` reports."""

    name: str
    tags: tuple[str, ...]
    running: float
    waiting: float
    kv_cache: float
    engines: int = 1


# Routing scores running + 10 * waiting: vllm-a (2) takes untagged traffic, and of
# the ``smart`` pair vllm-b (15) is preferred over the busy vllm-c (37).
DEMO_POOL = (
    PoolMember("vllm-a", ("general",), running=2, waiting=0, kv_cache=0.31),
    PoolMember("vllm-b", ("general", "smart"), running=5, waiting=1, kv_cache=0.64),
    PoolMember("vllm-c", ("general", "smart"), running=7, waiting=3, kv_cache=0.93, engines=2),
)


def demo_profiles() -> list[ModelProfile]:
    """``llm`` (the whole pool) and ``llm-smart`` (the ``smart`` backends only)."""
    return [
        ModelProfile(
            id="llm",
            name="Demo Llama",
            base_model=DEMO_POOL_MODEL,
            tags=[],
            supports_tools=True,
            supports_images=False,
            context_window_tokens=32768,
            max_output_tokens=4096,
            enabled=True,
            fallback_profile_id=None,
            slow_threshold_ms=None,
            failover_chain=[],
        ),
        ModelProfile(
            id="llm-smart",
            name="Demo Llama (smart pool)",
            base_model=DEMO_POOL_MODEL,
            tags=["smart"],
            supports_tools=True,
            supports_images=False,
            context_window_tokens=32768,
            max_output_tokens=4096,
            enabled=True,
            fallback_profile_id="llm",
            slow_threshold_ms=2000,
            failover_chain=["llm"],
        ),
    ]


def write_demo_pool_file(path: Path, urls: Mapping[str, str]) -> None:
    """The demo pool as a seed file; ``overwrite`` because its ports may change."""
    backends = [
        {
            "name": member.name,
            "url": urls[member.name],
            "models": [DEMO_POOL_MODEL],
            "tags": list(member.tags),
            "overwrite": True,
        }
        for member in DEMO_POOL
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"backends": backends}, indent=2) + "\n")


def _write_private(path: Path, data: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2)


def load_demo_secrets(data_dir: Path) -> dict[str, str]:
    """Demo mode keeps its generated secrets in the data dir so restarts keep logins."""
    path = data_dir / DEMO_FILE
    stored: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    changed = False
    if "jwt_secret" not in stored:
        stored["jwt_secret"] = secrets.token_urlsafe(48)
        changed = True
    if "vault_keys" not in stored:
        stored["vault_keys"] = generate_key_spec("demo1")
        changed = True
    if "admin_password" not in stored:
        stored["admin_password"] = secrets.token_urlsafe(12)
        changed = True
    if changed:
        _write_private(path, stored)
    return stored


def save_demo_value(data_dir: Path, key: str, value: str) -> None:
    path = data_dir / DEMO_FILE
    stored: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    stored[key] = value
    _write_private(path, stored)


async def create_admin(
    db_config: SQLAlchemyAsyncConfig,
    hasher: PasswordHasher,
    *,
    email: str,
    password: str,
    name: str = "",
) -> tuple[User, bool]:
    """Create a platform admin, or promote (and re-password) an existing user."""
    normalized = normalize_email(email)
    password_hash = await hasher.hash(password)
    async with UserService.new(config=db_config) as users:
        existing = await users.get_by_email(normalized)
        if existing is not None:
            existing.is_admin = True
            existing.disabled = False
            existing.password_hash = password_hash
            return await users.update(existing, auto_commit=True), False
        user = await users.create_user(
            email=normalized, password_hash=password_hash, name=name, is_admin=True
        )
        return user, True


async def register_demo_upstream(db_config: SQLAlchemyAsyncConfig, vault: Vault, url: str) -> None:
    """Register the bundled fake upstream as an ``external`` backend, so chat works at once."""
    async with BackendConfigService.new(config=db_config) as backends:
        await backends.register(
            ValidRegistration(
                name=DEMO_BACKEND,
                kind="external",
                url=url,
                api_key=None,
                models=(DEMO_CHAT_MODEL, DEMO_EMBEDDING_MODEL),
            ),
            vault,
        )


async def register_demo_engine(db_config: SQLAlchemyAsyncConfig, vault: Vault, url: str) -> None:
    """Register the bundled reference engine as an ``engine`` backend (models discovered)."""
    async with BackendConfigService.new(config=db_config) as backends:
        await backends.register(
            ValidRegistration(name=DEMO_ENGINE, kind="engine", url=url, api_key=None, models=()),
            vault,
        )


async def ensure_demo_profiles(db_config: SQLAlchemyAsyncConfig) -> list[str]:
    """Insert the demo model profiles that do not exist yet; returns the ids added.

    Rows are written directly (not through the profiles service): an admin's later
    edits of ``llm`` or ``llm-smart`` are kept, only missing ones are added.
    """
    wanted = demo_profiles()
    async with db_config.get_session() as session:
        existing = set(
            await session.scalars(
                select(ModelProfile.id).where(ModelProfile.id.in_([p.id for p in wanted]))
            )
        )
        added = [profile for profile in wanted if profile.id not in existing]
        session.add_all(added)
        await session.commit()
    return [profile.id for profile in added]


DEMO_PRICES_FROM = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
DEMO_PRICES: tuple[tuple[str, int, int | None, int, int | None], ...] = (
    # model, input, cached input, output, embedding: micro-units per million tokens.
    (DEMO_CHAT_MODEL, 150_000, 75_000, 600_000, None),
    (DEMO_EMBEDDING_MODEL, 20_000, None, 0, 20_000),
    (DEMO_POOL_MODEL, 100_000, None, 300_000, None),
    (DEMO_ENGINE_MODEL, 50_000, None, 200_000, None),
)


async def ensure_demo_prices(db_config: SQLAlchemyAsyncConfig) -> list[str]:
    """Platform prices for the demo models that have none, in force since the start of
    2026, so usage shows cost at once; returns the models priced. Written directly
    (history can only be seeded, never written through the API)."""
    models = [price[0] for price in DEMO_PRICES]
    async with db_config.get_session() as session:
        priced = set(
            await session.scalars(
                select(ModelPrice.model).where(
                    ModelPrice.model.in_(models), ModelPrice.project_id.is_(None)
                )
            )
        )
        added = [
            ModelPrice(
                model=model,
                input_micros=input_micros,
                cached_input_micros=cached,
                output_micros=output,
                embedding_micros=embedding,
                currency="USD",
                effective_from=DEMO_PRICES_FROM,
            )
            for model, input_micros, cached, output, embedding in DEMO_PRICES
            if model not in priced
        ]
        session.add_all(added)
        await session.commit()
    return [price.model for price in added]


async def ensure_demo_runtime_token(
    db_config: SQLAlchemyAsyncConfig,
    settings: Settings,
    stored: str | None,
    *,
    project_id: uuid.UUID,
    created_by: uuid.UUID,
) -> str:
    """The stored runtime token while it stays usable for a day, else a new one."""
    tokens = TokenService(settings.jwt_secret)
    async with RuntimeTokenService.new(config=db_config) as service:
        if stored is not None and await _runtime_token_usable(service, tokens, stored, project_id):
            return stored
        _, issued = await service.issue(
            tokens=tokens,
            project_id=project_id,
            name="demo",
            ttl_seconds=settings.runtime_token_ttl_seconds,
            created_by=created_by,
        )
    save_demo_value(settings.data_dir, "runtime_token", issued.token)
    return issued.token


async def _runtime_token_usable(
    service: RuntimeTokenService, tokens: TokenService, token: str, project_id: uuid.UUID
) -> bool:
    try:
        claims = tokens.verify(token, RUNTIME_AUDIENCE)
        token_id = uuid.UUID(claims["jti"])
    except (TokenError, ValueError):
        return False  # another JWT secret, say
    if float(claims["exp"]) < time.time() + RUNTIME_TOKEN_MIN_REMAINING_SECONDS:
        return False
    row = await service.get_one_or_none(
        RuntimeToken.id == token_id, RuntimeToken.project_id == project_id
    )
    return row is not None and row.revoked_at is None


async def ensure_demo(
    settings: Settings,
    hasher: PasswordHasher,
    *,
    upstream_url: str | None = None,
    engine_url: str | None = None,
) -> DemoCredentials:
    """Idempotently create the demo admin, project, API key, runtime token, model
    profiles, demo upstream and engine backends (the vLLM pool is seeded at start-up)."""
    db_config = build_db_config(settings)
    stored = load_demo_secrets(settings.data_dir)
    try:
        if upstream_url is not None:
            await register_demo_upstream(db_config, Vault(settings.vault_keys), upstream_url)
        if engine_url is not None:
            await register_demo_engine(db_config, Vault(settings.vault_keys), engine_url)
        admin, _ = await create_admin(
            db_config,
            hasher,
            email=DEMO_ADMIN_EMAIL,
            password=stored["admin_password"],
            name="Demo admin",
        )
        async with ProjectService.new(config=db_config) as projects:
            project = await projects.get_one_or_none(Project.slug == DEMO_PROJECT_SLUG)
            if project is None:
                project = await projects.create_owned(
                    name="Demo project", slug=DEMO_PROJECT_SLUG, owner_id=admin.id
                )
        api_key = stored.get("api_key")
        async with ApiKeyService.new(config=db_config) as keys:
            still_valid = api_key is not None and (
                await keys.repository.session.scalar(
                    select(ApiKey.id).where(
                        ApiKey.key_hash == sha256_hex(api_key),
                        ApiKey.project_id == project.id,
                        ApiKey.revoked_at.is_(None),
                    )
                )
                is not None
            )
            if not still_valid or api_key is None:
                _, api_key = await keys.issue(
                    project_id=project.id, name="demo", created_by=admin.id
                )
                save_demo_value(settings.data_dir, "api_key", api_key)
        runtime_token = await ensure_demo_runtime_token(
            db_config,
            settings,
            stored.get("runtime_token"),
            project_id=project.id,
            created_by=admin.id,
        )
        await ensure_demo_profiles(db_config)
        await ensure_demo_prices(db_config)
        return DemoCredentials(
            admin_email=DEMO_ADMIN_EMAIL,
            admin_password=stored["admin_password"],
            project_id=str(project.id),
            api_key=api_key,
            runtime_token=runtime_token,
        )
    finally:
        await db_config.get_engine().dispose()
