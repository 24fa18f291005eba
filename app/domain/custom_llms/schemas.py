"""Bodies of the custom LLMs API (camelCase on the wire, like the rest of the Projects API).

A key goes in (``apiKey``) and never comes out: responses carry only how the
endpoint is authenticated (``credential``), the ``secretId`` it refers to, or the
masked ``apiKeyHint`` of a key typed in directly.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Literal
from uuid import UUID

import msgspec

from app.domain.bodies import Camel, Strict, Tokens

# Url-safe and lower case: the name is the path segment and the model id's suffix
# (``custom:<name>``), so ``Bob`` and ``bob`` must not both exist. Patterns end in
# ``\Z``: ``$`` would also match before a trailing newline.
NAME_PATTERN = r"^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?\Z"
MAX_NAME_LENGTH = 64
MAX_KEY_LENGTH = 4096

LlmName = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN, max_length=MAX_NAME_LENGTH)]
BaseUrl = Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^\S(?:.*\S)?\Z")]
Provider = Annotated[
    str,
    msgspec.Meta(
        min_length=1, max_length=64, pattern=r"^[A-Za-z0-9](?:[A-Za-z0-9 ._-]*[A-Za-z0-9])?\Z"
    ),
]
# Visible ASCII only: the key ends up in an HTTP header.
ApiKeyValue = Annotated[
    str, msgspec.Meta(min_length=1, max_length=MAX_KEY_LENGTH, pattern=r"^[\x21-\x7e]+\Z")
]
AuthSchemeIn = Literal["bearer", "api-key", "ApiKey", "none"]
TemplateIn = Literal["bob", "custom"]
Credential = Literal["secret", "apiKey", "none"]


class CustomLlmFields(Strict):
    """The fields of a custom LLM body, each optional; which ones a template requires,
    allows or locks is checked by the service (``templates``)."""

    template: TemplateIn | msgspec.UnsetType = msgspec.UNSET
    name: LlmName | msgspec.UnsetType = msgspec.UNSET
    base_url: BaseUrl | msgspec.UnsetType = msgspec.UNSET
    model: ModelName | msgspec.UnsetType = msgspec.UNSET
    auth_scheme: AuthSchemeIn | msgspec.UnsetType = msgspec.UNSET
    provider: Provider | msgspec.UnsetType = msgspec.UNSET
    max_input_tokens: Tokens | msgspec.UnsetType = msgspec.UNSET
    max_output_tokens: Tokens | msgspec.UnsetType = msgspec.UNSET
    api_key: ApiKeyValue | msgspec.UnsetType | None = msgspec.UNSET
    secret_id: UUID | msgspec.UnsetType | None = msgspec.UNSET
    enabled: bool | msgspec.UnsetType = msgspec.UNSET


class CustomLlmCreate(CustomLlmFields):
    """Every field but ``template`` is optional here (a redefined field keeps its
    place, so the wire order is that of ``CustomLlmFields``)."""

    template: TemplateIn = "bob"
    api_key: ApiKeyValue | msgspec.UnsetType = msgspec.UNSET
    secret_id: UUID | msgspec.UnsetType = msgspec.UNSET
    enabled: bool = True

    def __repr__(self) -> str:
        # Keeps the key out of tracebacks and debug output that repr the body.
        return f"CustomLlmCreate(template={self.template!r}, name={self.name!r}, apiKey=<hidden>)"


class CustomLlmUpdate(CustomLlmFields):
    """A partial update; ``apiKey``/``secretId`` null drops that credential. A
    ``template`` is always refused (400 ``locked_field``): it is chosen at creation."""

    def __repr__(self) -> str:
        return f"CustomLlmUpdate(name={self.name!r}, apiKey=<hidden>)"


class CustomLlmOut(Camel):
    id: UUID
    project_id: UUID
    name: str
    llm_id: str
    """The model id runtimes and ``/v1`` clients call it by: ``custom:<name>``."""
    template: str
    base_url: str
    model: str
    auth_scheme: str
    provider: str
    max_input_tokens: int
    max_output_tokens: int
    enabled: bool
    credential: Credential
    """Where the key comes from: a project ``secret``, an ``apiKey`` stored with this
    entry, or ``none`` (authScheme ``none``)."""
    secret_id: UUID | None
    api_key_hint: str | None
    """``••••`` and the last four characters of a stored ``apiKey``."""
    created_at: datetime.datetime
    updated_at: datetime.datetime


class CustomLlmTestOut(Camel):
    """``POST .../custom-llms/{name}/test``: one cheap real call to the endpoint."""

    ok: bool
    status: int | None
    """The upstream's HTTP status; null when no answer came (refused, unreachable)."""
    latency_ms: int | None
    """Duration of the call that decided ``status``; null when none was made."""
    detail: str
