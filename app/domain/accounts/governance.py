"""Per-key governance: what one API key or runtime token may do.

An owner may give a key (or a runtime token) allowed models (exact ids, or prefixes
written with a trailing ``*``), requests and tokens per minute, a money budget per day
or month, an expiry and free-form labels. ``KeyPolicy`` is the part the hot path
needs, held in memory with the credential (the API key index, the runtime token
policy cache) and carried by the principal and the ``Caller``:

- expiry is checked at use time against the clock by the authenticator (an expired
  key is refused like a revoked one, on every replica, with no event needed);
- allowed models are checked by ``CallAdmission`` before any upstream;
- ``rpm``, ``tpm`` and the budget are windows of the call's one atomic admission
  (``QuotaGate.reserve``): tokens and cost are held at the call's estimate and
  settled to its actual use when it is metered.

``check_governance`` validates what a create or PATCH sends (the API answers the
first error as a 400 naming the field; the console shows all of them beside their
fields). Framework-free apart from the body struct's msgspec types.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import msgspec

from app.domain.bodies import Strict
from app.lib.errors import BadRequestError, PermissionDeniedError

BUDGET_PERIODS = ("day", "month")
MAX_ALLOWED_MODELS = 100
MAX_LABELS = 20
MAX_LABEL_KEY = 63
MAX_LABEL_VALUE = 200
MAX_RPM = 1_000_000
MAX_TPM = 2_000_000_000
"""Within the 32-bit column."""
MICROS = 1_000_000
MAX_BUDGET_MICROS = 10**15
"""A billion currency units: far past any real budget, well within a BIGINT."""

# A model id as clients send it (``gpt-4o``, ``llama3:8b``, ``custom:bob``,
# ``org/model@rev``), optionally ending in one ``*`` to make it a prefix.
_MODEL_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}\*?")
_LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,62}")
_BUDGET = re.compile(r"\d{1,10}(\.\d{1,6})?")


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    """What the hot path enforces for one credential (all optional)."""

    exact_models: frozenset[str] | None = None
    """``None``: every model; else these ids and anything under ``model_prefixes``."""
    model_prefixes: tuple[str, ...] = ()
    rpm: int | None = None
    tpm: int | None = None
    budget_micros: int | None = None
    budget_period: str | None = None
    expires_at: float | None = None
    """Epoch seconds; refused from then on."""

    @classmethod
    def of(
        cls,
        *,
        allowed_models: Iterable[str] | None,
        rpm: int | None,
        tpm: int | None,
        budget_micros: int | None,
        budget_period: str | None,
        expires_at: datetime.datetime | None,
    ) -> KeyPolicy:
        exact: frozenset[str] | None = None
        prefixes: tuple[str, ...] = ()
        if allowed_models is not None:
            models = list(allowed_models)
            exact = frozenset(m for m in models if not m.endswith("*"))
            prefixes = tuple(m[:-1] for m in models if m.endswith("*"))
        return cls(
            exact_models=exact,
            model_prefixes=prefixes,
            rpm=rpm,
            tpm=tpm,
            budget_micros=budget_micros,
            budget_period=budget_period,
            expires_at=None if expires_at is None else expires_at.timestamp(),
        )

    @classmethod
    def of_row(cls, row: Any) -> KeyPolicy:
        """From an ``ApiKey`` or ``RuntimeToken`` row (or any object with its fields)."""
        return cls.of(
            allowed_models=row.allowed_models,
            rpm=row.rpm,
            tpm=row.tpm,
            budget_micros=row.budget_micros,
            budget_period=row.budget_period,
            expires_at=row.expires_at,
        )

    @property
    def limits_models(self) -> bool:
        return self.exact_models is not None

    @property
    def restricted(self) -> bool:
        """Whether any limit or expiry applies (such a key may not issue or edit
        credentials: it could otherwise give itself a way around them)."""
        return self != UNRESTRICTED

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def allows(self, name: str) -> bool:
        """Whether the credential may call model ``name``."""
        if self.exact_models is None or name in self.exact_models:
            return True
        return any(name.startswith(prefix) for prefix in self.model_prefixes)

    def allows_any(self, names: Iterable[str]) -> bool:
        return any(self.allows(name) for name in names)

    def allowed_text(self) -> str:
        shown = sorted(self.exact_models or ()) + [f"{p}*" for p in self.model_prefixes]
        more = "" if len(shown) <= 5 else f" and {len(shown) - 5} more"
        return ", ".join(shown[:5]) + more if shown else "none"


UNRESTRICTED = KeyPolicy()


class ModelNotAllowedError(PermissionDeniedError):
    """403: the credential's allowed models do not include the requested one."""

    default_code = "model_not_allowed"

    def __init__(self, model: str, policy: KeyPolicy) -> None:
        super().__init__(
            f"this credential may not call model {model[:200]!r}; "
            f"it may call: {policy.allowed_text()}",
            param="model",
        )


# ------------------------------------------------------------------ the wire


class GovernanceFields(Strict):
    """The governance fields of a create or PATCH body (camelCase on the wire).

    Unsent fields are ``UNSET`` (left as they are); ``null`` clears one. Types are
    loose on purpose: ``check_governance`` validates them all and names the field.
    """

    allowed_models: list[str] | msgspec.UnsetType | None = msgspec.UNSET
    rpm: int | msgspec.UnsetType | None = msgspec.UNSET
    tpm: int | msgspec.UnsetType | None = msgspec.UNSET
    budget: str | int | float | msgspec.UnsetType | None = msgspec.UNSET
    """A decimal amount in the price book's currency (``"25"``, ``"0.50"``, ``12.5``)."""
    budget_period: str | msgspec.UnsetType | None = msgspec.UNSET
    """``day`` or ``month`` (default ``month`` when a budget is set without one)."""
    expires_at: datetime.datetime | msgspec.UnsetType | None = msgspec.UNSET
    labels: dict[str, str] | msgspec.UnsetType | None = msgspec.UNSET


@dataclass(frozen=True, slots=True)
class FieldError:
    code: str
    message: str


class GovernanceErrors(BadRequestError):
    """400 for the first invalid field (``param`` names it); ``fields`` holds all."""

    def __init__(self, fields: dict[str, FieldError]) -> None:
        param, first = next(iter(fields.items()))
        super().__init__(first.message, code=first.code, param=param)
        self.fields = fields


def budget_text(micros: int | None) -> str | None:
    """Micro-units as an exact decimal string (``2500000`` -> ``"2.5"``)."""
    if micros is None:
        return None
    text = f"{Decimal(micros) / MICROS:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def parse_budget(value: str | int | float) -> int | None:
    """A money amount (``"25.50"``, ``25``, ``25.5``) in micro-units; ``None`` when it
    is negative, has more than 6 decimals or is above ``MAX_BUDGET_MICROS``."""
    if isinstance(value, bool):
        return None
    # A float's repr is its shortest exact spelling (``format(x, "f")`` would round
    # 1.1234567 to 6 decimals and accept it); Decimal spells ``1e-05`` as 0.00001.
    text = format(Decimal(repr(value)), "f") if isinstance(value, float) else str(value)
    if not _BUDGET.fullmatch(text.strip()):
        return None
    try:
        micros = int(Decimal(text.strip()) * MICROS)
    except InvalidOperation:
        return None
    return micros if micros <= MAX_BUDGET_MICROS else None


def _limit(value: int, ceiling: int, what: str) -> FieldError | None:
    if value < 0:
        return FieldError("invalid_limit", f"{what} must be zero or more, got {value}")
    if value > ceiling:
        return FieldError("invalid_limit", f"{what} must be at most {ceiling}, got {value}")
    return None


def _models_error(models: list[str]) -> FieldError | None:
    if len(models) > MAX_ALLOWED_MODELS:
        return FieldError(
            "invalid_model_pattern",
            f"at most {MAX_ALLOWED_MODELS} allowed models, got {len(models)}",
        )
    for model in models:
        if not _MODEL_PATTERN.fullmatch(model):
            return FieldError(
                "invalid_model_pattern",
                f"{model[:80]!r} is not a model id or a prefix ending in one `*` "
                "(letters, digits and . _ : / @ + - only, starting with a letter or digit)",
            )
    return None


def _labels_error(labels: dict[str, str]) -> FieldError | None:
    if len(labels) > MAX_LABELS:
        return FieldError("invalid_labels", f"at most {MAX_LABELS} labels, got {len(labels)}")
    for key, value in labels.items():
        if not _LABEL_KEY.fullmatch(key):
            return FieldError(
                "invalid_labels",
                f"label key {key[:80]!r} must be 1-{MAX_LABEL_KEY} letters, digits or . _ / - "
                "starting with a letter or digit",
            )
        if len(value) > MAX_LABEL_VALUE or any(ord(c) < 32 for c in value):
            return FieldError(
                "invalid_labels",
                f"label {key!r}: values are at most {MAX_LABEL_VALUE} printable characters",
            )
    return None


def check_governance(
    fields: GovernanceFields,
    *,
    now: datetime.datetime,
    current_period: str | None = None,
) -> tuple[dict[str, Any], dict[str, FieldError]]:
    """The column values to write (only for fields sent) and every invalid field,
    by its wire name. ``current_period`` is the stored budget period (PATCH)."""
    values: dict[str, Any] = {}
    errors: dict[str, FieldError] = {}
    if fields.allowed_models is not msgspec.UNSET:
        models = fields.allowed_models
        error = None if models is None else _models_error(models)
        if error is not None:
            errors["allowedModels"] = error
        else:
            values["allowed_models"] = None if models is None else list(dict.fromkeys(models))
    for name, ceiling, what in (("rpm", MAX_RPM, "rpm"), ("tpm", MAX_TPM, "tpm")):
        value = getattr(fields, name)
        if value is msgspec.UNSET:
            continue
        error = None if value is None else _limit(value, ceiling, what)
        if error is not None:
            errors[name] = error
        else:
            values[name] = value
    if fields.budget is not msgspec.UNSET:
        if fields.budget is None:
            values["budget_micros"] = None
            values["budget_period"] = None
        else:
            micros = parse_budget(fields.budget)
            if micros is None:
                errors["budget"] = FieldError(
                    "invalid_limit",
                    "budget must be a decimal amount of zero or more with at most 6 decimals "
                    f"and at most {MAX_BUDGET_MICROS // MICROS}",
                )
            else:
                values["budget_micros"] = micros
                values["budget_period"] = current_period or "month"
    if fields.budget_period is not msgspec.UNSET and fields.budget is not None:
        if fields.budget_period not in BUDGET_PERIODS:
            errors["budgetPeriod"] = FieldError(
                "invalid_budget_period", "budgetPeriod must be `day` or `month`"
            )
        else:
            values["budget_period"] = fields.budget_period
    if fields.expires_at is not msgspec.UNSET:
        expires = fields.expires_at
        if expires is not None and expires.tzinfo is None:
            errors["expiresAt"] = FieldError(
                "invalid_expiry", "expiresAt needs a time zone (e.g. 2027-01-31T00:00:00Z)"
            )
        elif expires is not None and expires <= now:
            errors["expiresAt"] = FieldError("expires_in_past", "expiresAt must be in the future")
        else:
            values["expires_at"] = expires
    if fields.labels is not msgspec.UNSET:
        error = None if fields.labels is None else _labels_error(fields.labels)
        if error is not None:
            errors["labels"] = error
        else:
            values["labels"] = fields.labels
    return values, errors


def valid_governance(
    fields: GovernanceFields, *, now: datetime.datetime, current_period: str | None = None
) -> dict[str, Any]:
    """``check_governance`` for the API: the values, or a 400 naming the first field."""
    values, errors = check_governance(fields, now=now, current_period=current_period)
    if errors:
        raise GovernanceErrors(errors)
    return values
