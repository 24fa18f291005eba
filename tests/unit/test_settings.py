from __future__ import annotations

import base64

import pytest

from app.lib.settings import (
    DEFAULT_DATABASE_URL,
    DEFAULT_MAX_BODY_BYTES,
    Settings,
    SettingsError,
    load_settings,
    parse_vault_keys,
)

KEY = base64.b64encode(b"k" * 32).decode()


def test_defaults_are_the_embedded_first_run():
    settings = load_settings({})
    assert settings.database_url == DEFAULT_DATABASE_URL == "sqlite+aiosqlite:///./arona.db"
    assert settings.redis_url is None
    assert settings.port == 8420
    assert settings.host == "127.0.0.1"
    assert settings.max_body_bytes == DEFAULT_MAX_BODY_BYTES == 4 * 1024 * 1024
    assert settings.cors_origins == ()
    assert settings.registration_open is False


def test_environment_is_read():
    settings = load_settings(
        {
            "ARONA_DATABASE_URL": "postgresql+asyncpg://db/arona",
            "ARONA_REDIS_URL": "redis://cache:6379/0",
            "ARONA_JWT_SECRET": "s" * 40,
            "ARONA_VAULT_KEYS": f"new:{KEY},old:{KEY}",
            "ARONA_ADMIN_TOKEN": "admin-token",
            "ARONA_HOST": "0.0.0.0",
            "ARONA_PORT": "9000",
            "ARONA_MAX_BODY_BYTES": "8192",
            "ARONA_CORS_ORIGINS": "https://a.example, https://b.example",
            "ARONA_LOG_FORMAT": "json",
            "ARONA_REGISTRATION_OPEN": "true",
        }
    )
    assert settings.redis_url == "redis://cache:6379/0"
    assert [k.kid for k in settings.vault_keys] == ["new", "old"]
    assert settings.port == 9000
    assert settings.max_body_bytes == 8192
    assert settings.cors_origins == ("https://a.example", "https://b.example")
    assert settings.log_format == "json"
    assert settings.registration_open is True
    settings.validate()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ARONA_PORT": "http"}, "ARONA_PORT must be an integer"),
        # Past 65535 the socket layer would wrap it silently (70000 binds 4464).
        ({"ARONA_PORT": "70000"}, "ARONA_PORT must be <= 65535"),
        ({"ARONA_PORT": "65536"}, "ARONA_PORT must be <= 65535"),
        ({"ARONA_LOG_LEVEL": "loud"}, "ARONA_LOG_LEVEL must be one of"),
        ({"ARONA_VAULT_KEYS": f"bad kid:{KEY}"}, "ARONA_VAULT_KEYS key id 'bad kid'"),
        ({"ARONA_VAULT_KEYS": f"{'k' * 65}:{KEY}"}, "ARONA_VAULT_KEYS key id"),
        ({"ARONA_LOG_FORMAT": "xml"}, "ARONA_LOG_FORMAT must be json or console"),
        ({"ARONA_REGISTRATION_OPEN": "perhaps"}, "must be a boolean"),
        ({"ARONA_MAX_BODY_BYTES": "10"}, "must be >= 1024"),
        ({"ARONA_VAULT_KEYS": "nokid"}, "kid:base64"),
        ({"ARONA_VAULT_KEYS": "a:!!!"}, "not valid base64"),
        ({"ARONA_VAULT_KEYS": f"a:{base64.b64encode(b'short').decode()}"}, "32 bytes"),
        ({"ARONA_VAULT_KEYS": f"a:{KEY},a:{KEY}"}, "twice"),
        ({"ARONA_HEALTH_INTERVAL_SECONDS": "often"}, "ARONA_HEALTH_INTERVAL_SECONDS must be a"),
        ({"ARONA_HEALTH_INTERVAL_SECONDS": "0"}, "ARONA_HEALTH_INTERVAL_SECONDS must be > 0"),
        ({"ARONA_USAGE_FLUSH_SECONDS": "-1"}, "ARONA_USAGE_FLUSH_SECONDS must be > 0"),
        ({"ARONA_USAGE_FLUSH_SECONDS": "nan"}, "ARONA_USAGE_FLUSH_SECONDS must be > 0"),
        ({"ARONA_USAGE_FLUSH_SECONDS": "inf"}, "ARONA_USAGE_FLUSH_SECONDS must be > 0"),
    ],
)
def test_malformed_settings_are_refused_with_the_variable_named(env, message):
    with pytest.raises(SettingsError, match=message):
        load_settings(env)


def test_edge_values_are_accepted():
    settings = load_settings(
        {"ARONA_PORT": "65535", "ARONA_LOG_LEVEL": "warning", "ARONA_VAULT_KEYS": f"k-1.a_b:{KEY}"}
    )
    assert (settings.port, settings.log_level) == (65535, "WARNING")
    assert settings.vault_keys[0].kid == "k-1.a_b"


def test_routing_intervals_default_and_are_read():
    defaults = load_settings({})
    assert defaults.health_interval_seconds == 60.0
    assert defaults.usage_flush_seconds == 1.0
    settings = load_settings(
        {"ARONA_HEALTH_INTERVAL_SECONDS": "2.5", "ARONA_USAGE_FLUSH_SECONDS": "0.25"}
    )
    assert settings.health_interval_seconds == 2.5
    assert settings.usage_flush_seconds == 0.25


def test_validate_refuses_missing_or_short_secret_and_missing_vault_keys():
    with pytest.raises(SettingsError, match="missing"):
        Settings(vault_keys=parse_vault_keys(f"a:{KEY}")).validate()
    with pytest.raises(SettingsError, match="too short"):
        Settings(jwt_secret="x" * 10, vault_keys=parse_vault_keys(f"a:{KEY}")).validate()
    with pytest.raises(SettingsError, match="ARONA_VAULT_KEYS"):
        Settings(jwt_secret="x" * 40).validate()


def test_vault_key_material_is_not_in_repr():
    settings = load_settings({"ARONA_VAULT_KEYS": f"a:{KEY}"})
    assert KEY not in repr(settings)
    assert repr(b"k" * 32) not in repr(settings)


def test_step_7_and_8_settings_default_and_are_read():
    defaults = load_settings({})
    assert defaults.evernight_url == "ws://127.0.0.1:3001/ws"
    assert defaults.evernight_keepalive_seconds == 15.0
    assert defaults.agent_offline_seconds == 30.0
    assert defaults.video_timeout_seconds == 1350.0
    assert defaults.video_poll_seconds == 2.0
    assert defaults.video_lease_seconds == 30.0
    assert defaults.forwarded_allow_ips is None
    settings = load_settings(
        {
            "ARONA_EVERNIGHT_URL": "ws://10.0.0.2:3001/ws",
            "ARONA_EVERNIGHT_KEEPALIVE_SECONDS": "5",
            "ARONA_AGENT_OFFLINE_SECONDS": "45",
            "ARONA_VIDEO_TIMEOUT_SECONDS": "600",
            "ARONA_VIDEO_POLL_SECONDS": "0.5",
            "ARONA_VIDEO_LEASE_SECONDS": "10",
            "ARONA_FORWARDED_ALLOW_IPS": " 10.0.0.0/8,127.0.0.1 ",
        }
    )
    assert settings.evernight_url == "ws://10.0.0.2:3001/ws"
    assert settings.evernight_keepalive_seconds == 5.0
    assert settings.agent_offline_seconds == 45.0
    assert settings.video_timeout_seconds == 600.0
    assert settings.video_poll_seconds == 0.5
    assert settings.video_lease_seconds == 10.0
    assert settings.forwarded_allow_ips == "10.0.0.0/8,127.0.0.1"


@pytest.mark.parametrize(
    "name",
    [
        "ARONA_EVERNIGHT_KEEPALIVE_SECONDS",
        "ARONA_AGENT_OFFLINE_SECONDS",
        "ARONA_VIDEO_TIMEOUT_SECONDS",
        "ARONA_VIDEO_POLL_SECONDS",
        "ARONA_VIDEO_LEASE_SECONDS",
    ],
)
@pytest.mark.parametrize("raw", ["0", "-1", "soon", "nan"])
def test_new_intervals_must_be_positive_numbers(name: str, raw: str) -> None:
    with pytest.raises(SettingsError, match=name):
        load_settings({name: raw})


def test_forwarded_headers_are_trusted_only_from_listed_proxies():
    from app.cli.common import uvicorn_config

    secrets = {"jwt_secret": "s" * 32, "vault_keys": parse_vault_keys(f"k1:{KEY}")}
    direct = uvicorn_config(load_settings({}, **secrets))
    assert direct.proxy_headers is False
    proxied = uvicorn_config(load_settings({"ARONA_FORWARDED_ALLOW_IPS": "10.0.0.0/8"}, **secrets))
    assert proxied.proxy_headers is True
    assert proxied.forwarded_allow_ips == "10.0.0.0/8"
