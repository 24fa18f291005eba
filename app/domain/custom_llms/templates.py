"""The two templates of a custom LLM and the rules of which fields a client may set.

- ``bob``: IBM Bob's inference endpoint. Every technical field is fixed here and
  locked: a client sends only ``name`` (default ``bob``), ``enabled`` and a
  credential (``apiKey`` or ``secretId``); sending a locked field is a 400
  ``locked_field`` naming it, whatever its value.
- ``custom``: any OpenAI-compatible endpoint; the client sets every field.

``template`` itself is chosen once, at creation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from app.lib.errors import BadRequestError
from app.routing.types import AuthScheme

Template = Literal["bob", "custom"]
TEMPLATES: Final = ("bob", "custom")
AUTH_SCHEMES: Final = ("bearer", "api-key", "ApiKey", "none")


@dataclass(frozen=True, slots=True)
class Technical:
    """The fields that say where and how to call an endpoint."""

    base_url: str
    model: str
    """The model name sent upstream (Bob: ``premium``)."""
    auth_scheme: AuthScheme
    provider: str
    max_input_tokens: int
    max_output_tokens: int


BOB: Final = Technical(
    base_url="https://api.us-east.bob.ibm.com/inference/v1",
    model="premium",
    auth_scheme="ApiKey",  # sent as ``Authorization: ApiKey <key>``
    provider="bob",
    max_input_tokens=160_000,
    max_output_tokens=40_000,
)
BOB_DEFAULT_NAME: Final = "bob"

# The technical fields by wire name (camelCase), in the order they are checked.
TECHNICAL_FIELDS: Final = (
    ("baseUrl", "base_url"),
    ("model", "model"),
    ("authScheme", "auth_scheme"),
    ("provider", "provider"),
    ("maxInputTokens", "max_input_tokens"),
    ("maxOutputTokens", "max_output_tokens"),
)

# Defaults of a ``custom`` endpoint where the client leaves them out.
CUSTOM_DEFAULT_PROVIDER: Final = "custom"
CUSTOM_DEFAULT_MAX_INPUT_TOKENS: Final = 8192
CUSTOM_DEFAULT_MAX_OUTPUT_TOKENS: Final = 2048


def locked_field(param: str, template: str) -> BadRequestError:
    return BadRequestError(
        f"`{param}` is set by the {template} template and cannot be changed",
        code="locked_field",
        param=param,
    )


def context_window_tokens(max_input_tokens: int, max_output_tokens: int) -> int:
    """What the catalog shows as ``contextWindowTokens``: input and output share the
    window, so it is their sum (Bob: 160000 + 40000 = 200000)."""
    return max_input_tokens + max_output_tokens
