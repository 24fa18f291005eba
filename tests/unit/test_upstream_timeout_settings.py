"""ARONA_UPSTREAM_CONNECT_TIMEOUT_SECONDS and ARONA_UPSTREAM_READ_TIMEOUT_SECONDS: read,
validated, and handed to the process's upstream pool (how long a hung upstream can hold
a call before it counts as a failure; tests/cluster/test_upstream_faults.py relies on
them end to end)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.lib.http import CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS, UpstreamLimits
from app.lib.passwords import PasswordHasher
from app.lib.settings import SettingsError, load_settings
from app.server.resources import build_resources
from tests.support.settings import base_settings

CONNECT = "ARONA_UPSTREAM_CONNECT_TIMEOUT_SECONDS"
READ = "ARONA_UPSTREAM_READ_TIMEOUT_SECONDS"


def test_defaults_are_the_upstream_clients_own() -> None:
    settings = load_settings({})
    assert settings.upstream_connect_timeout_seconds == CONNECT_TIMEOUT_SECONDS == 10.0
    assert settings.upstream_read_timeout_seconds == READ_TIMEOUT_SECONDS == 120.0


def test_the_environment_sets_them() -> None:
    settings = load_settings({CONNECT: "0.5", READ: "2.5"})
    assert settings.upstream_connect_timeout_seconds == 0.5
    assert settings.upstream_read_timeout_seconds == 2.5


@pytest.mark.parametrize("name", [CONNECT, READ])
@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf", "nan"])
def test_a_timeout_must_be_a_positive_number(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        load_settings({name: value})


async def test_the_app_pool_uses_them(tmp_path: Path, fast_hasher: PasswordHasher) -> None:
    settings = base_settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'arona.db'}",
        upstream_connect_timeout_seconds=0.75,
        upstream_read_timeout_seconds=3.0,
    )
    resources = build_resources(settings, password_hasher=fast_hasher)
    try:
        timeout = resources.http_client.timeout
        assert (timeout.connect, timeout.sock_connect, timeout.sock_read) == (0.75, 0.75, 3.0)
        assert timeout.total is None  # streams may run for long: only reads are bounded
    finally:
        await resources.http_client.aclose()
        await resources.db_config.get_engine().dispose()


LIMIT_VARIABLES = {
    "ARONA_UPSTREAM_MAX_BODY_BYTES": ("upstream_max_body_bytes", 65536),
    "ARONA_UPSTREAM_MAX_EVENT_BYTES": ("upstream_max_event_bytes", 4096),
    "ARONA_UPSTREAM_MAX_LISTING_BYTES": ("upstream_max_listing_bytes", 4096),
    "ARONA_UPSTREAM_MAX_ERROR_BYTES": ("upstream_max_error_bytes", 256),
}


@pytest.mark.parametrize(("name", "spec"), sorted(LIMIT_VARIABLES.items()))
def test_read_bounds_are_read_and_have_a_floor(name: str, spec: tuple[str, int]) -> None:
    field, floor = spec
    assert getattr(load_settings({name: str(floor)}), field) == floor
    with pytest.raises(SettingsError, match=name):
        load_settings({name: str(floor - 1)})
    with pytest.raises(SettingsError, match=name):
        load_settings({name: "lots"})


@pytest.mark.parametrize(
    "name", ["ARONA_UPSTREAM_STREAM_IDLE_TIMEOUT_SECONDS", "ARONA_UPSTREAM_TIMEOUT_SECONDS"]
)
def test_stream_idle_and_total_deadline_must_be_positive(name: str) -> None:
    assert load_settings({name: "2.5"}) != load_settings({})
    with pytest.raises(SettingsError, match=name):
        load_settings({name: "0"})


async def test_both_pools_bound_reads_as_configured(
    tmp_path: Path, fast_hasher: PasswordHasher
) -> None:
    settings = base_settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'arona.db'}",
        upstream_max_body_bytes=100_000,
        upstream_max_event_bytes=5_000,
        upstream_max_listing_bytes=6_000,
        upstream_max_error_bytes=700,
        upstream_timeout_seconds=42.0,
        upstream_stream_idle_timeout_seconds=7.0,
    )
    resources = build_resources(settings, password_hasher=fast_hasher)
    expected = UpstreamLimits(100_000, 5_000, 6_000, 700, 42.0, 7.0)
    try:
        assert resources.http_client.limits == expected
        # The project-chosen upstreams (custom LLMs) are bounded the same way.
        assert resources.custom_llms.http.limits == expected
    finally:
        await resources.http_client.aclose()
        await resources.custom_llms.http.aclose()
        await resources.db_config.get_engine().dispose()
