"""Operator tasks behind the CLI: create an admin, prepare the demo installation."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from advanced_alchemy.config.asyncio import SQLAlchemyAsyncConfig
from sqlalchemy import select

from app.db.config import build_db_config
from app.db.models import ApiKey, Project, User
from app.domain.accounts.credential_services import ApiKeyService
from app.domain.accounts.services import UserService, normalize_email
from app.domain.backends.schemas import ValidRegistration
from app.domain.backends.services import BackendConfigService
from app.domain.projects.services import ProjectService
from app.lib.hashing import sha256_hex
from app.lib.passwords import PasswordHasher
from app.lib.settings import Settings
from app.lib.vault import Vault, generate_key_spec

DEMO_ADMIN_EMAIL = "admin@demo.arona.local"
DEMO_BACKEND = "demo-upstream"
DEMO_CHAT_MODEL = "demo-chat"
DEMO_EMBEDDING_MODEL = "demo-embed"
DEMO_PROJECT_SLUG = "demo"
DEMO_FILE = "demo.json"


@dataclass(frozen=True, slots=True)
class DemoCredentials:
    admin_email: str
    admin_password: str
    project_id: str
    api_key: str


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


async def ensure_demo(
    settings: Settings, hasher: PasswordHasher, *, upstream_url: str | None = None
) -> DemoCredentials:
    """Idempotently create the demo admin, project, API key and demo upstream backend."""
    db_config = build_db_config(settings)
    stored = load_demo_secrets(settings.data_dir)
    try:
        if upstream_url is not None:
            await register_demo_upstream(db_config, Vault(settings.vault_keys), upstream_url)
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
        return DemoCredentials(
            admin_email=DEMO_ADMIN_EMAIL,
            admin_password=stored["admin_password"],
            project_id=str(project.id),
            api_key=api_key,
        )
    finally:
        await db_config.get_engine().dispose()
