"""Bodies of the backend and alias admin API (snake_case on the wire, like ``/v1``)."""

from __future__ import annotations

import datetime
from typing import Annotated
from urllib.parse import SplitResult, urlsplit

import msgspec

from app.lib.errors import BadRequestError
from app.routing.backends import factory
from app.routing.evernight import EvernightUrlError, is_evernight, parse_evernight

NAME_PATTERN = r"^[A-Za-z0-9._-]+$"
AGENT_PREFIX = "agent-"
"""Backends of models deployed by GPU agents; Arona names and manages them itself."""
MAX_MODELS = 1000
MAX_TAGS = 32
# Kinds whose upstream lists its own models and authenticates by network position:
# a key or a static list given for them is dropped rather than stored unused.
KINDS_WITHOUT_KEY_OR_MODELS = frozenset({"ollama"})
HTTP_SCHEMES = ("http", "https")
WS_SCHEMES = ("ws", "wss")
WS_KINDS = frozenset({"engine"})
"""Kinds that speak WebSocket (CEP engines); every other kind speaks HTTP."""
STATIC_ONLY_KINDS = frozenset({"minimax-cloud"})
"""Kinds with no model discovery and a key-authenticated cloud API: a registration
needs its static model list (what routing advertises) and its API key (the probe
could never turn healthy without one)."""

BackendName = Annotated[str, msgspec.Meta(min_length=1, max_length=100, pattern=NAME_PATTERN)]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"\S")]
BackendUrl = Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]
ApiKey = Annotated[str, msgspec.Meta(max_length=8192)]
KindName = Annotated[str, msgspec.Meta(min_length=1, max_length=32)]
# Checked before trimming: a tag is 1-64 characters and not only blanks.
TagName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"\S")]
MAX_CONCURRENCY = 100_000
MaxConcurrency = Annotated[int, msgspec.Meta(ge=1, le=MAX_CONCURRENCY)]
"""Requests a backend runs at once (its batch slots), as the operator knows it."""


class Strict(msgspec.Struct, forbid_unknown_fields=True):
    pass


class BackendRegistration(Strict):
    name: BackendName
    type: KindName
    url: BackendUrl
    api_key: ApiKey | None = None
    models: Annotated[list[ModelName], msgspec.Meta(max_length=MAX_MODELS)] = []
    tags: Annotated[list[TagName], msgspec.Meta(max_length=MAX_TAGS)] = []
    max_concurrency: MaxConcurrency | None = None
    """None (or absent): routing learns the capacity from the backend's metrics."""


class ValidRegistration(msgspec.Struct, frozen=True):
    """A registration after every check: normalized kind, key, model and tag lists."""

    name: str
    kind: str
    url: str
    api_key: str | None
    models: tuple[str, ...]
    tags: tuple[str, ...] = ()
    max_concurrency: int | None = None


class HealthOut(msgspec.Struct):
    status: str
    reason: str
    checked_at: datetime.datetime | None


class BreakerOut(msgspec.Struct):
    state: str
    consecutive_failures: int
    open_seconds_left: float = 0.0
    """Until the half-open trial (0 unless open); a breaker another replica opened
    shows here too, with the time it has left."""
    cooling_seconds_left: float = 0.0
    """The cooldown after a retryable failure (on any replica): routing passes the
    backend over while another candidate is warm."""


class BackendOut(msgspec.Struct):
    name: str
    type: str
    url: str
    """As registered (an ``evernight://`` URL stays one)."""
    resolved_url: str | None
    """Where this replica reaches an ``evernight://`` backend now (its tunnel's local
    port); None for every other URL, and while the tunnel cannot be resolved."""
    has_api_key: bool
    models: list[str]
    """The static list given at registration."""
    tags: list[str]
    """A profile that requires tags is served only by backends carrying all of them."""
    max_concurrency: int | None
    """Requests the backend runs at once (its batch slots) as registered; None: routing
    learns it from the backend's metrics once a queue has been seen."""
    advertised_models: list[str]
    """What routing uses now: the static list, then the models the last probe found."""
    health: HealthOut
    breaker: BreakerOut
    in_flight: int
    created_at: datetime.datetime
    updated_at: datetime.datetime


AliasName = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"\S")]


class AliasIn(Strict):
    alias: AliasName
    target: AliasName


class AliasOut(msgspec.Struct):
    alias: str
    target: str
    created_at: datetime.datetime


def check_backend_url(url: str, kind: str = "external") -> str:
    """The one place URL schemes are decided: ``ws``/``wss`` for engine backends,
    ``http``/``https`` for the rest, and ``evernight://node/service`` for any kind."""
    value = url.strip()
    if is_evernight(value):
        try:
            parse_evernight(value)
        except EvernightUrlError as exc:
            raise _bad_url(str(exc)) from exc
        return value
    try:
        parts: SplitResult = urlsplit(value)
        port = parts.port  # raises on a malformed port
    except ValueError as exc:
        # Not echoing the parser's message: it may quote part of the URL.
        raise _bad_url("url is not a valid URL (check the host and port)") from exc
    schemes = WS_SCHEMES if kind in WS_KINDS else HTTP_SCHEMES
    if parts.scheme.lower() not in schemes:
        allowed = " or ".join(f"{scheme}://" for scheme in schemes)
        raise _bad_url(f"url must start with {allowed} (or evernight://) for {kind} backends")
    if not parts.hostname:
        raise _bad_url("url has no host")
    if parts.username is not None or parts.password is not None:
        # The URL is shown back by the API; a credential belongs in api_key.
        raise _bad_url("url must not carry credentials: send the key as api_key")
    if port == 0:
        raise _bad_url("url has an invalid port")
    if parts.query or parts.fragment:
        raise _bad_url("url must not have a query or fragment")
    return value


def _bad_url(message: str) -> BadRequestError:
    return BadRequestError(message, code="invalid_url", param="url")


def check_kind(kind: str) -> str:
    try:
        return factory.check_kind(kind)
    except BadRequestError as exc:
        exc.param = exc.param or "type"
        raise


def validate_registration(data: BackendRegistration) -> ValidRegistration:
    if data.name.startswith(AGENT_PREFIX):
        raise BadRequestError(
            f"backend names starting with {AGENT_PREFIX!r} are kept for models deployed by "
            "GPU agents (deploy through /api/admin/agent-deployments)",
            code="reserved_name",
            param="name",
        )
    kind = check_kind(data.type)
    url = check_backend_url(data.url, kind)
    # Tags are routing metadata, kept for every kind; trimmed, order kept, no duplicates.
    tags = tuple(dict.fromkeys(t.strip() for t in data.tags))
    slots = data.max_concurrency
    if kind in KINDS_WITHOUT_KEY_OR_MODELS:
        return ValidRegistration(
            name=data.name,
            kind=kind,
            url=url,
            api_key=None,
            models=(),
            tags=tags,
            max_concurrency=slots,
        )
    api_key = data.api_key if data.api_key else None
    # Order kept (the static list has precedence in that order), duplicates dropped.
    models = tuple(dict.fromkeys(m.strip() for m in data.models))
    if kind in STATIC_ONLY_KINDS:
        _check_static_only(kind, api_key, models)
    return ValidRegistration(
        name=data.name,
        kind=kind,
        url=url,
        api_key=api_key,
        models=models,
        tags=tags,
        max_concurrency=slots,
    )


def _check_static_only(kind: str, api_key: str | None, models: tuple[str, ...]) -> None:
    if not models:
        raise BadRequestError(
            f"a {kind} backend discovers no models: list the ones it serves in models",
            code="models_required",
            param="models",
        )
    if api_key is None or not api_key.strip():
        raise BadRequestError(
            f"a {kind} backend needs its API key", code="api_key_required", param="api_key"
        )


def validate_alias(data: AliasIn) -> tuple[str, str]:
    alias, target = data.alias.strip(), data.target.strip()
    if alias == target:
        raise BadRequestError(
            "an alias cannot point to itself", code="alias_is_target", param="target"
        )
    return alias, target
