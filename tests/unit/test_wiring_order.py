"""The order of the area components: starts run in list order, closes in reverse
(docs/architecture.md, "Wiring"), so what is built on something must come after it."""

from __future__ import annotations

from pathlib import Path

from app.lib.passwords import PasswordHasher
from app.server.resources import build_resources
from tests.support.settings import base_settings


async def test_areas_come_after_what_they_are_built_on(
    tmp_path: Path, fast_hasher: PasswordHasher
) -> None:
    settings = base_settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'arona.db'}")
    resources = build_resources(settings, password_hasher=fast_hasher)
    try:
        names = [component.name for component in resources.components]
    finally:
        await resources.custom_llms.close()
        await resources.http_client.aclose()
        await resources.db_config.get_engine().dispose()
    assert len(names) == len(set(names))
    # The core (engine, bus, store, Redis, HTTP pool) is first, so it closes last:
    # usage drains, video leases go back and key use is flushed before the engine goes.
    assert names[0] == "core"
    # Revocations are restored before backends are seeded; the failover switch loads
    # after the profiles it applies to, which load after the backends.
    assert names.index("accounts") < names.index("routing")
    assert names.index("routing") < names.index("profiles") < names.index("failover")


async def test_every_dependency_comes_from_a_component(
    tmp_path: Path, fast_hasher: PasswordHasher
) -> None:
    settings = base_settings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'arona.db'}")
    resources = build_resources(settings, password_hasher=fast_hasher)
    try:
        provided = {
            name: component.name
            for component in resources.components
            for name in component.provides()
        }
    finally:
        await resources.custom_llms.close()
        await resources.http_client.aclose()
        await resources.db_config.get_engine().dispose()
    assert provided["usage_writer"] == "usage"
    assert provided["backend_registry"] == "routing"
    assert provided["custom_llms"] == "custom_llms"
    assert provided["settings"] == "core"
