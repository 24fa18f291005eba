"""The ``/v1`` gateway end to end: a live app with a user, a project and an API key
(``GatewayEnv``), and what tests build around it."""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
from sqlalchemy import select
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models.usage import UsageRecord
from app.fakes.ollama_upstream import FakeOllama
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.lib.settings import Settings
from app.server.resources import Resources
from tests.support.api import eventually
from tests.support.helpers import bearer, new_project, new_user
from tests.support.live_server import live_server
from tests.support.settings import AppFactory

ADMIN_TOKEN = "gateway-admin-" + "a" * 32
ADMIN = bearer(ADMIN_TOKEN)
# Long enough that three failing calls and a status read fit inside it on a loaded
# machine; the half-open step then waits it out.
BREAKER_OPEN_SECONDS = 2.0
HEALTH_ROUNDS_NEVER = 3600.0
REPROBE_AFTER_SECONDS = 3.0


def unique(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


@dataclass
class GatewayEnv:
    url: str
    http: httpx.AsyncClient
    resources: Resources
    api_key: str
    project_id: str
    stack: contextlib.AsyncExitStack
    user_headers: dict[str, str]
    registered: list[str] = field(default_factory=list)

    @property
    def settings(self) -> Settings:
        return self.resources.settings

    def sdk(self, api_key: str | None = None) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.url}/v1", api_key=api_key or self.api_key, max_retries=0
        )

    async def fake(self, tag: str = "up", **options: Any) -> tuple[FakeOpenAI, str]:
        fake = FakeOpenAI(unique(tag), **options)
        url = await self.stack.enter_async_context(serve_asgi(fake))
        return fake, url

    async def ollama(self, tag: str = "ollama", **options: Any) -> tuple[FakeOllama, str]:
        fake = FakeOllama(unique(tag), **options)
        url = await self.stack.enter_async_context(serve_asgi(fake))
        return fake, url

    async def register(
        self,
        name: str,
        url: str,
        *,
        models: list[str] | None = None,
        type: str = "external",
        api_key: str | None = None,
        healthy: bool = True,
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {"name": name, "type": type, "url": url}
        if models is not None:
            payload["models"] = models
        if api_key is not None:
            payload["api_key"] = api_key
        response = await self.http.post("/api/admin/backends", json=payload, headers=ADMIN)
        assert response.status_code == 201, response.text
        self.registered.append(name)
        if healthy:
            await self.wait_health(name, "healthy")
        body: dict[str, Any] = response.json()
        return body

    async def backend(self, name: str) -> dict[str, Any]:
        response = await self.http.get(f"/api/admin/backends/{name}", headers=ADMIN)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def wait_health(self, name: str, status: str, within: float = 10.0) -> float:
        """Wait until ``name`` shows ``status``. Health rounds are off in these tests,
        so a registration probe lost to a loaded machine (its 2 s timeout) would never
        be retried: probe again, as an admin would, while the status is not reached."""
        last_probe = time.monotonic()
        seen: Any = None

        async def reached() -> bool:
            nonlocal last_probe, seen
            seen = (await self.backend(name))["health"]
            if seen["status"] == status:
                return True
            if time.monotonic() - last_probe > REPROBE_AFTER_SECONDS:
                await self.http.post(f"/api/admin/backends/{name}/probe", headers=ADMIN)
                last_probe = time.monotonic()
            return False

        try:
            return await eventually(reached, within=within)
        except AssertionError as exc:
            raise AssertionError(f"{name} not {status}: last seen {seen}") from exc

    async def probe_all(self) -> None:
        """Run a health round now instead of waiting for the interval."""
        await self.resources.health_checker.probe_all()

    async def usage_rows(self) -> list[UsageRecord]:
        await self.resources.usage_writer.flush()
        engine = create_async_engine(self.settings.database_url)
        try:
            async with engine.connect() as conn:
                result = await conn.execute(
                    select(UsageRecord)
                    .where(UsageRecord.project_id == uuid.UUID(self.project_id))
                    .order_by(UsageRecord.created_at)
                )
                return list(result.all())  # type: ignore[arg-type]
        finally:
            await engine.dispose()


async def open_env(
    settings: Settings, make_app: AppFactory, stack: contextlib.AsyncExitStack
) -> GatewayEnv:
    """A live app on ``settings`` with a user, a project and an API key; its backends
    are unregistered when ``stack`` closes."""
    app = make_app(settings)
    url = await stack.enter_async_context(live_server(app))
    http = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
    _, headers = await new_user(http, "gw")  # type: ignore[arg-type]
    project = await new_project(http, headers)  # type: ignore[arg-type]
    key = await http.post(
        f"/api/projects/{project['id']}/api-keys", json={"name": "sdk"}, headers=headers
    )
    assert key.status_code == 201, key.text
    gateway = GatewayEnv(
        url=url,
        http=http,
        resources=app.state.resources,
        api_key=key.json()["key"],
        project_id=project["id"],
        stack=stack,
        user_headers=headers,
    )

    async def unregister() -> None:
        for name in gateway.registered:
            await http.delete(f"/api/admin/backends/{name}", headers=ADMIN)

    stack.push_async_callback(unregister)
    return gateway
