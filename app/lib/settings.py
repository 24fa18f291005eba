"""Process settings: the only module that reads the environment.

Settings are read once into frozen dataclasses and handed to whatever needs them;
nothing else in the code base calls ``os.environ``.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

MIN_JWT_SECRET_LENGTH = 32
DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./arona.db"
DEFAULT_PORT = 8420
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


class SettingsError(ValueError):
    """A setting is missing or malformed; the message tells the operator which and why."""


MAX_PORT = 65535
LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")
_VAULT_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")

_Parse = Callable[[str, str], object]
"""Turns a variable's raw value (its name for the error message) into a setting."""


def valid_key_id(kid: str) -> bool:
    """Vault key ids travel in every sealed value's header: a short, plain token."""
    return _VAULT_KEY_ID.fullmatch(kid) is not None


@dataclass(frozen=True, slots=True)
class VaultKey:
    kid: str
    key: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str | None = None
    redis_prefix: str = "arona:"
    jwt_secret: str = ""
    vault_keys: tuple[VaultKey, ...] = ()
    admin_token: str | None = None
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    cors_origins: tuple[str, ...] = ()
    log_format: Literal["json", "console"] = "console"
    log_level: str = "INFO"
    registration_open: bool = False
    demo: bool = False
    data_dir: Path = field(default_factory=lambda: Path(".arona"))
    access_token_ttl_seconds: int = 15 * 60
    refresh_token_ttl_seconds: int = 30 * 24 * 3600
    runtime_token_ttl_seconds: int = 90 * 24 * 3600
    login_max_attempts: int = 10
    login_window_seconds: int = 300
    db_pool_size: int = 10
    db_connect_timeout_seconds: float = 5.0
    """How long opening a PostgreSQL connection may take before the request fails
    (503 ``database_unavailable``) instead of hanging on an unreachable database."""
    db_pool_timeout_seconds: float = 10.0
    """How long a request waits for a free pooled connection before the same 503."""
    negative_key_cache_ttl_seconds: float = 5.0
    last_used_flush_seconds: float = 10.0
    health_interval_seconds: float = 60.0
    usage_flush_seconds: float = 1.0
    usage_wal: bool = True
    """With Redis: append usage to a Redis stream before answering (no loss when a
    replica is killed) instead of only buffering it in memory."""
    usage_wal_max_entries: int = 1_000_000
    """The stream is trimmed to about this many entries (a long database outage)."""
    quota_hold_seconds: float = 120.0
    """How long a call's token and budget reservation lives without being extended
    (a live call extends it every half of this): how soon a killed replica's
    in-flight reservations stop counting."""
    quota_default_output_tokens: int = 1024
    """A chat call's output estimate when it sets no ``max_tokens`` and its model
    has no known output limit (settled to the actual count when it ends)."""
    breaker_failure_threshold: int = 3
    breaker_open_seconds: float = 30.0
    backend_cooldown_seconds: float = 30.0
    upstream_connect_timeout_seconds: float = 10.0
    """Getting a connection to an upstream (``app.lib.http.CONNECT_TIMEOUT_SECONDS``)."""
    upstream_read_timeout_seconds: float = 120.0
    """Silence allowed between two reads of an upstream's answer, the wait for its
    headers included (``app.lib.http.READ_TIMEOUT_SECONDS``): how long a hung upstream
    holds a call before it counts as a failure."""
    upstream_stream_idle_timeout_seconds: float = 60.0
    """Silence allowed between two chunks of an upstream stream once it has started
    (``app.lib.http.UpstreamLimits.stream_idle_seconds``); a stalled stream ends with
    an error event after this long instead of holding the call for the read timeout."""
    upstream_timeout_seconds: float = 600.0
    """Overall deadline of a non-streamed upstream call, body included."""
    upstream_max_body_bytes: int = 32 * 1024 * 1024
    """Largest non-streamed upstream answer read (chat, embeddings, video API replies);
    a larger one is cut, its connection closed, and the call fails with 502."""
    upstream_max_event_bytes: int = 1024 * 1024
    """Largest single line of an upstream stream (an SSE line or event, an NDJSON line)."""
    upstream_max_listing_bytes: int = 4 * 1024 * 1024
    """Largest model listing, health probe answer or metrics scrape read."""
    upstream_max_error_bytes: int = 4096
    """How much of an upstream error body is read for the error message."""
    routing_score: Literal["seed", "capacity"] = "capacity"
    """How candidates are ranked unless a profile says otherwise: ``capacity`` (a free
    batch slot first, then the shortest expected wait) or ``seed`` (``running +
    10 * waiting``); both on current inputs (``app.routing.load``)."""
    vllm_metrics_busy_seconds: float = 0.25
    """A vLLM backend with requests on it has its ``/metrics`` read this often."""
    vllm_metrics_fresh_seconds: float = 2.0
    """An idle vLLM backend has its ``/metrics`` read this often."""
    vllm_metrics_expire_seconds: float = 10.0
    """A reading older than this (scrapes failing) makes the backend's metrics
    unavailable: it is ranked last (the 1,000,000 penalty) until one answers."""
    vllm_backends_file: Path | None = None
    """None: seed from ``config/vllm-backends.json`` when that file exists."""
    failover_window_seconds: float = 30.0
    failover_min_samples: int = 3
    failover_slow_threshold_ms: float = 10_000.0
    """Typical TTFT above which a profile with a failover chain and no threshold of its
    own is slow."""
    session_idle_seconds: int = 30 * 60
    custom_llm_allow_private: bool = False
    """Let project custom LLMs reach loopback, private, link-local and reserved addresses
    (tests and demos with local fakes); cloud metadata addresses stay refused."""
    evernight_url: str = "ws://127.0.0.1:3001/ws"
    """The local evernight bridge agent that resolves ``evernight://node/service`` URLs."""
    evernight_keepalive_seconds: float = 15.0
    """How often each evernight tunnel is checked (and followed to a new local port)."""
    agent_offline_seconds: float = 30.0
    """A GPU agent whose last heartbeat is older than this shows as offline."""
    forwarded_allow_ips: str | None = None
    """Proxies (comma-separated addresses or CIDRs, ``*`` for any) whose
    ``X-Forwarded-For``/``-Proto`` are trusted; None trusts none (direct clients)."""
    video_timeout_seconds: float = 22.5 * 60
    """A video job still unfinished this long after it was created fails as timed out."""
    video_poll_seconds: float = 2.0
    """First wait between two polls of a video task (it backs off from there)."""
    video_lease_seconds: float = 30.0
    """How long a replica holds a video job it polls; another takes it over after."""
    webhook_allow_private: bool = False
    """Let project webhooks reach loopback, private, link-local and reserved addresses,
    and use plain ``http://`` (tests and demos with local receivers); cloud metadata
    addresses stay refused."""
    webhook_timeout_seconds: float = 10.0
    """One webhook delivery attempt, connect to last byte of the answer's excerpt."""
    webhook_max_attempts: int = 5
    """Attempts of a threshold event before its delivery is marked failed."""
    webhook_retry_base_seconds: float = 45.0
    """Wait before the second attempt; each later wait is 4 times the previous one
    (45 s, 3 min, 12 min, 48 min: five attempts over about an hour), +/- 20 % jitter."""
    webhook_ca_file: Path | None = None
    """A PEM bundle of extra certificate authorities webhook receivers may be signed
    by (a private PKI), trusted besides the system's store."""

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    def validate(self) -> None:
        """Refuse to start on settings that would run insecurely or not at all."""
        if len(self.jwt_secret) < MIN_JWT_SECRET_LENGTH:
            what = "missing" if not self.jwt_secret else "too short"
            raise SettingsError(
                f"ARONA_JWT_SECRET is {what}: set it to at least {MIN_JWT_SECRET_LENGTH} "
                "random characters (for example `python -c 'import secrets; "
                "print(secrets.token_urlsafe(48))'`), or run `arona demo`."
            )
        if not self.vault_keys:
            raise SettingsError(
                "ARONA_VAULT_KEYS is empty: set it to `kid:base64-of-32-random-bytes` "
                "(newest first, comma separated), or run `arona demo`."
            )


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise SettingsError(f"{name} must be a boolean (true/false), got {raw!r}")


def _parse_int(name: str, raw: str, minimum: int = 0, maximum: int | None = None) -> int:
    try:
        value = int(raw)
    except ValueError as exc:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from exc
    if value < minimum:
        raise SettingsError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise SettingsError(f"{name} must be <= {maximum}, got {value}")
    return value


def _parse_positive_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError as exc:
        raise SettingsError(f"{name} must be a number, got {raw!r}") from exc
    # NaN and infinity would make every timer misbehave silently.
    if not value > 0 or value == float("inf"):
        raise SettingsError(f"{name} must be > 0, got {raw!r}")
    return value


def parse_vault_keys(raw: str) -> tuple[VaultKey, ...]:
    """Parse ``kid:base64,kid:base64`` (newest first) into vault keys."""
    keys: list[VaultKey] = []
    seen: set[str] = set()
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        kid, sep, encoded = part.partition(":")
        if not sep or not kid:
            raise SettingsError("ARONA_VAULT_KEYS entries must look like `kid:base64-32-bytes`")
        if not valid_key_id(kid):
            raise SettingsError(
                f"ARONA_VAULT_KEYS key id {kid!r} must be 1-64 characters of letters, "
                "digits, '.', '_' or '-'"
            )
        if kid in seen:
            raise SettingsError(f"ARONA_VAULT_KEYS lists key id {kid!r} twice")
        try:
            key = base64.b64decode(encoded, validate=True)
        except ValueError as exc:
            raise SettingsError(f"ARONA_VAULT_KEYS key {kid!r} is not valid base64") from exc
        if len(key) != 32:
            raise SettingsError(
                f"ARONA_VAULT_KEYS key {kid!r} must decode to 32 bytes, got {len(key)}"
            )
        seen.add(kid)
        keys.append(VaultKey(kid=kid, key=key))
    return tuple(keys)


def _text(name: str, raw: str) -> str:
    return raw


def _stripped(name: str, raw: str) -> str:
    return raw.strip()


def _path(name: str, raw: str) -> Path:
    return Path(raw)


def _comma_list(name: str, raw: str) -> tuple[str, ...]:
    return tuple(o.strip() for o in raw.split(",") if o.strip())


def _vault_keys(name: str, raw: str) -> tuple[VaultKey, ...]:
    return parse_vault_keys(raw)


def _int(minimum: int, maximum: int | None = None) -> _Parse:
    return partial(_parse_int, minimum=minimum, maximum=maximum)


def _either(first: str, second: str) -> _Parse:
    def parse(name: str, raw: str) -> str:
        if raw not in (first, second):
            raise SettingsError(f"{name} must be {first} or {second}, got {raw!r}")
        return raw

    return parse


def _log_level(name: str, raw: str) -> str:
    if raw.upper() not in LOG_LEVELS:
        raise SettingsError(f"{name} must be one of {', '.join(LOG_LEVELS)}, got {raw!r}")
    return raw.upper()


_ENV: tuple[tuple[str, str, _Parse], ...] = (
    ("ARONA_DATABASE_URL", "database_url", _text),
    ("ARONA_REDIS_URL", "redis_url", _text),
    ("ARONA_REDIS_PREFIX", "redis_prefix", _text),
    ("ARONA_JWT_SECRET", "jwt_secret", _text),
    ("ARONA_VAULT_KEYS", "vault_keys", _vault_keys),
    ("ARONA_ADMIN_TOKEN", "admin_token", _text),
    ("ARONA_HOST", "host", _text),
    ("ARONA_PORT", "port", _int(0, MAX_PORT)),
    ("ARONA_MAX_BODY_BYTES", "max_body_bytes", _int(1024)),
    ("ARONA_CORS_ORIGINS", "cors_origins", _comma_list),
    ("ARONA_LOG_FORMAT", "log_format", _either("json", "console")),
    ("ARONA_LOG_LEVEL", "log_level", _log_level),
    ("ARONA_REGISTRATION_OPEN", "registration_open", _parse_bool),
    ("ARONA_DATA_DIR", "data_dir", _path),
    ("ARONA_ACCESS_TOKEN_TTL", "access_token_ttl_seconds", _int(30)),
    ("ARONA_REFRESH_TOKEN_TTL", "refresh_token_ttl_seconds", _int(60)),
    ("ARONA_RUNTIME_TOKEN_TTL", "runtime_token_ttl_seconds", _int(60)),
    ("ARONA_LOGIN_MAX_ATTEMPTS", "login_max_attempts", _int(1)),
    ("ARONA_LOGIN_WINDOW", "login_window_seconds", _int(1)),
    ("ARONA_DB_POOL_SIZE", "db_pool_size", _int(1)),
    ("ARONA_DB_CONNECT_TIMEOUT_SECONDS", "db_connect_timeout_seconds", _parse_positive_float),
    ("ARONA_DB_POOL_TIMEOUT_SECONDS", "db_pool_timeout_seconds", _parse_positive_float),
    ("ARONA_HEALTH_INTERVAL_SECONDS", "health_interval_seconds", _parse_positive_float),
    ("ARONA_USAGE_FLUSH_SECONDS", "usage_flush_seconds", _parse_positive_float),
    ("ARONA_USAGE_WAL", "usage_wal", _parse_bool),
    ("ARONA_USAGE_WAL_MAX_ENTRIES", "usage_wal_max_entries", _int(1000)),
    ("ARONA_QUOTA_HOLD_SECONDS", "quota_hold_seconds", _parse_positive_float),
    ("ARONA_QUOTA_DEFAULT_OUTPUT_TOKENS", "quota_default_output_tokens", _int(0, 10_000_000)),
    ("ARONA_BREAKER_FAILURE_THRESHOLD", "breaker_failure_threshold", _int(1)),
    ("ARONA_BREAKER_OPEN_SECONDS", "breaker_open_seconds", _parse_positive_float),
    ("ARONA_BACKEND_COOLDOWN_SECONDS", "backend_cooldown_seconds", _parse_positive_float),
    (
        "ARONA_UPSTREAM_CONNECT_TIMEOUT_SECONDS",
        "upstream_connect_timeout_seconds",
        _parse_positive_float,
    ),
    ("ARONA_UPSTREAM_READ_TIMEOUT_SECONDS", "upstream_read_timeout_seconds", _parse_positive_float),
    (
        "ARONA_UPSTREAM_STREAM_IDLE_TIMEOUT_SECONDS",
        "upstream_stream_idle_timeout_seconds",
        _parse_positive_float,
    ),
    ("ARONA_UPSTREAM_TIMEOUT_SECONDS", "upstream_timeout_seconds", _parse_positive_float),
    ("ARONA_UPSTREAM_MAX_BODY_BYTES", "upstream_max_body_bytes", _int(64 * 1024)),
    ("ARONA_UPSTREAM_MAX_EVENT_BYTES", "upstream_max_event_bytes", _int(4 * 1024)),
    ("ARONA_UPSTREAM_MAX_LISTING_BYTES", "upstream_max_listing_bytes", _int(4 * 1024)),
    ("ARONA_UPSTREAM_MAX_ERROR_BYTES", "upstream_max_error_bytes", _int(256)),
    ("ARONA_ROUTING_SCORE", "routing_score", _either("seed", "capacity")),
    ("ARONA_VLLM_METRICS_BUSY_SECONDS", "vllm_metrics_busy_seconds", _parse_positive_float),
    ("ARONA_VLLM_METRICS_FRESH_SECONDS", "vllm_metrics_fresh_seconds", _parse_positive_float),
    ("ARONA_VLLM_METRICS_EXPIRE_SECONDS", "vllm_metrics_expire_seconds", _parse_positive_float),
    ("ARONA_VLLM_BACKENDS_FILE", "vllm_backends_file", _path),
    ("ARONA_FAILOVER_WINDOW_SECONDS", "failover_window_seconds", _parse_positive_float),
    ("ARONA_SESSION_IDLE_SECONDS", "session_idle_seconds", _int(60)),
    ("ARONA_FAILOVER_MIN_SAMPLES", "failover_min_samples", _int(1)),
    ("ARONA_FAILOVER_SLOW_THRESHOLD_MS", "failover_slow_threshold_ms", _parse_positive_float),
    ("ARONA_CUSTOM_LLM_ALLOW_PRIVATE", "custom_llm_allow_private", _parse_bool),
    ("ARONA_EVERNIGHT_URL", "evernight_url", _text),
    ("ARONA_EVERNIGHT_KEEPALIVE_SECONDS", "evernight_keepalive_seconds", _parse_positive_float),
    ("ARONA_AGENT_OFFLINE_SECONDS", "agent_offline_seconds", _parse_positive_float),
    ("ARONA_FORWARDED_ALLOW_IPS", "forwarded_allow_ips", _stripped),
    ("ARONA_VIDEO_TIMEOUT_SECONDS", "video_timeout_seconds", _parse_positive_float),
    ("ARONA_VIDEO_POLL_SECONDS", "video_poll_seconds", _parse_positive_float),
    ("ARONA_VIDEO_LEASE_SECONDS", "video_lease_seconds", _parse_positive_float),
    ("ARONA_WEBHOOK_ALLOW_PRIVATE", "webhook_allow_private", _parse_bool),
    ("ARONA_WEBHOOK_TIMEOUT_SECONDS", "webhook_timeout_seconds", _parse_positive_float),
    ("ARONA_WEBHOOK_MAX_ATTEMPTS", "webhook_max_attempts", _int(1, 20)),
    ("ARONA_WEBHOOK_RETRY_BASE_SECONDS", "webhook_retry_base_seconds", _parse_positive_float),
    ("ARONA_WEBHOOK_CA_FILE", "webhook_ca_file", _path),
)
"""(variable, field, parser) of every setting read from the environment, in the order
they are checked (the first malformed one is the error reported)."""

SETTING_VARIABLES: frozenset[str] = frozenset(name for name, _, _ in _ENV)
"""Every ARONA_* variable the settings loader reads (deployment files are checked
against it)."""


def load_settings(env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """Build settings from the environment (or ``env``), then apply explicit overrides."""
    source = os.environ if env is None else env

    def get(name: str) -> str | None:
        value = source.get(name)
        return value if value not in (None, "") else None

    values: dict[str, object] = {}
    for name, field_name, parse in _ENV:
        if (v := get(name)) is not None:
            values[field_name] = parse(name, v)
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]
