"""Backend admin API across restarts and replicas: restore, undecryptable keys, sync.

Both "replicas" are full apps on one PostgreSQL database and one Redis, served on
loopback ports; a change made on one must reach the other within a second.
"""

from __future__ import annotations

import httpx
from litestar.testing import AsyncTestClient

from app.lib.settings import Settings, load_settings
from app.lib.vault import generate_key_spec
from tests.support.api import eventually, resources_of
from tests.support.live_server import live_server
from tests.support.routing import (
    ADMIN,
    UPSTREAM_KEY,
    Upstream,
    backend,
    register_backend,
    routing_pg_settings,
    routing_settings,
    unique_name,
    upstream,
    wait_healthy,
)
from tests.support.settings import AppFactory, with_settings

__all__ = ["routing_pg_settings", "routing_settings", "upstream"]


async def test_backends_are_restored_on_restart(
    routing_settings: Settings, make_app: AppFactory, upstream: Upstream
) -> None:
    _, url = upstream
    name = unique_name("restore")
    async with AsyncTestClient(app=make_app(routing_settings)) as first:
        response = await register_backend(
            first, name=name, type="external", url=url, api_key=UPSTREAM_KEY, models=["m"]
        )
        assert response.status_code == 201, response.text
        await wait_healthy(first, name)

    async with AsyncTestClient(app=make_app(routing_settings)) as second:
        state = resources_of(second).backend_registry.get(name)
        assert state is not None
        assert state.spec.api_key == UPSTREAM_KEY
        shown = await wait_healthy(second, name)
        assert shown["models"] == ["m"]
        assert shown["has_api_key"] is True
        assert "gpt-4o-mini" in shown["advertised_models"]


async def test_a_key_that_cannot_be_decrypted_skips_that_backend_only(
    routing_settings: Settings, make_app: AppFactory, upstream: Upstream
) -> None:
    _, url = upstream
    locked, open_ = unique_name("locked"), unique_name("open")
    async with AsyncTestClient(app=make_app(routing_settings)) as first:
        for name, key in ((locked, UPSTREAM_KEY), (open_, None)):
            response = await register_backend(
                first, name=name, type="external", url=url, api_key=key
            )
            assert response.status_code == 201, response.text

    # Restart with a vault that lacks the key the API key was sealed with.
    other_keys = load_settings({"ARONA_VAULT_KEYS": generate_key_spec("k2")}).vault_keys
    async with AsyncTestClient(
        app=make_app(with_settings(routing_settings, vault_keys=other_keys))
    ) as second:
        registry = resources_of(second).backend_registry
        assert registry.get(locked) is None
        assert registry.get(open_) is not None
        shown = (await backend(second, locked)).json()
        assert shown["health"]["status"] == "unknown"
        assert shown["has_api_key"] is True
        assert shown["advertised_models"] == []


async def test_a_backend_registered_on_one_replica_routes_on_the_other(
    routing_pg_settings: Settings, make_app: AppFactory, upstream: Upstream
) -> None:
    _, url = upstream
    name = unique_name("replica")
    app_a, app_b = make_app(routing_pg_settings), make_app(routing_pg_settings)
    async with (
        live_server(app_a) as url_a,
        live_server(app_b) as url_b,
        httpx.AsyncClient(base_url=url_a) as a,
        httpx.AsyncClient(base_url=url_b) as b,
    ):
        registry_b = app_b.state.resources.backend_registry
        assert registry_b.get(name) is None
        response = await register_backend(
            a, name=name, type="external", url=url, api_key=UPSTREAM_KEY
        )
        assert response.status_code == 201, response.text

        async def on_b() -> bool:
            return registry_b.get(name) is not None

        await eventually(on_b, within=5.0)
        assert registry_b.get(name).spec.api_key == UPSTREAM_KEY
        await wait_healthy(b, name)

        # Replacing and deleting travel the same way.
        response = await register_backend(a, name=name, type="external", url=url, models=["x"])
        assert response.status_code == 201, response.text

        async def replaced_on_b() -> bool:
            state = registry_b.get(name)
            return state is not None and state.spec.models == ("x",)

        await eventually(replaced_on_b, within=5.0)
        assert registry_b.get(name).spec.api_key is None

        # A change of the batch slots alone travels too, down to the load estimate.
        response = await register_backend(
            a, name=name, type="external", url=url, models=["x"], max_concurrency=16
        )
        assert response.status_code == 201, response.text

        async def slots_on_b() -> bool:
            state = registry_b.get(name)
            return state is not None and state.spec.max_concurrency == 16

        await eventually(slots_on_b, within=5.0)
        assert registry_b.get(name).load.max_concurrency == 16
        assert (await backend(b, name)).json()["max_concurrency"] == 16
        assert (await a.delete(f"/api/admin/backends/{name}", headers=ADMIN)).status_code == 204

        async def gone_on_b() -> bool:
            return registry_b.get(name) is None

        await eventually(gone_on_b, within=5.0)


async def test_a_probe_asked_for_on_one_replica_updates_the_other(
    routing_pg_settings: Settings, make_app: AppFactory, upstream: Upstream
) -> None:
    fake, url = upstream
    name = unique_name("probed")
    # No periodic rounds: only the probes the test asks for change the health.
    settings = with_settings(routing_pg_settings, health_interval_seconds=3600.0)
    app_a, app_b = make_app(settings), make_app(settings)
    async with (
        live_server(app_a) as url_a,
        live_server(app_b) as url_b,
        httpx.AsyncClient(base_url=url_a, timeout=30) as a,
        httpx.AsyncClient(base_url=url_b, timeout=30) as b,
    ):
        response = await register_backend(
            a, name=name, type="external", url=url, api_key=UPSTREAM_KEY
        )
        assert response.status_code == 201, response.text
        await wait_healthy(b, name)

        async def status_on_b(wanted: str) -> None:
            async def reached() -> bool:
                return bool((await backend(b, name)).json()["health"]["status"] == wanted)

            await eventually(reached, within=5.0)

        fake.control.fail_status = 503
        probed = await a.post(f"/api/admin/backends/{name}/probe", headers=ADMIN)
        assert probed.json()["health"]["status"] == "unhealthy"
        await status_on_b("unhealthy")
        fake.control.fail_status = None
        probed = await a.post(f"/api/admin/backends/{name}/probe", headers=ADMIN)
        assert probed.json()["health"]["status"] == "healthy"
        await status_on_b("healthy")

        # Registering it again as it was probes it too, and the result travels as well.
        fake.control.fail_status = 503
        again = await register_backend(a, name=name, type="external", url=url, api_key=UPSTREAM_KEY)
        assert again.status_code == 201, again.text
        await status_on_b("unhealthy")
        assert (await a.delete(f"/api/admin/backends/{name}", headers=ADMIN)).status_code == 204
