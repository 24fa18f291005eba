"""The Keys tab's governance: how a key's or token's limits are shown, and the edit
form read into the API's own ``GovernanceFields`` (so the console and the Projects
API validate alike). The form is a whole edit: an empty field clears its limit.
Every field is checked at once and each error is shown beside its field."""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from app.domain.accounts.governance import (
    GovernanceFields,
    budget_text,
    check_governance,
)

FIELDS = ("allowedModels", "rpm", "tpm", "budget", "budgetPeriod", "expiresAt", "labels")
PERIODS = [("", "(no budget)"), ("day", "per day"), ("month", "per month")]
_SPLIT = re.compile(r"[,\s]+")
_LABEL_SPLIT = re.compile(r"[,\n]+")


def governance_view(row: Any) -> dict[str, Any]:
    """What the tab shows of a row's governance, and the edit form's current values."""
    models = row.allowed_models
    labels = row.labels or {}
    budget = budget_text(row.budget_micros)
    limits = []
    if models is not None:
        limits.append("models: " + (", ".join(models) or "none"))
    if row.rpm is not None:
        limits.append(f"{row.rpm} req/min")
    if row.tpm is not None:
        limits.append(f"{row.tpm} tokens/min")
    if budget is not None:
        limits.append(f"budget {budget} per {row.budget_period or 'month'}")
    expires = row.expires_at
    return {
        "limits": limits,
        "labels": [f"{k}={v}" for k, v in sorted(labels.items())],
        "form": {
            "allowedModels": ", ".join(models or ()),
            "rpm": "" if row.rpm is None else str(row.rpm),
            "tpm": "" if row.tpm is None else str(row.tpm),
            "budget": budget or "",
            "budgetPeriod": row.budget_period or "",
            "expiresAt": "" if expires is None else expires.strftime("%Y-%m-%dT%H:%M"),
            "labels": ", ".join(f"{k}={v}" for k, v in sorted(labels.items())),
        },
    }


def _whole(text: str, errors: dict[str, str], name: str) -> int | None:
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        errors[name] = f"{name} must be a whole number (or empty for no limit)"
        return None


def _expiry(text: str, errors: dict[str, str]) -> datetime.datetime | None:
    if not text:
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        errors["expiresAt"] = "expiresAt must be a date and time, e.g. 2027-01-31T00:00 (UTC)"
        return None
    # The form's datetime-local has no zone: it is read as UTC, as the tab shows times.
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.UTC)


def _labels(text: str, errors: dict[str, str]) -> dict[str, str] | None:
    if not text:
        return None
    labels: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in _LABEL_SPLIT.split(text))):
        key, sep, value = part.partition("=")
        if not sep:
            errors["labels"] = (
                f"labels are key=value pairs separated by commas; {part[:40]!r} has no ="
            )
            return None
        labels[key.strip()] = value.strip()
    return labels


def read_form(
    values: Mapping[str, str], *, now: datetime.datetime, current: Any
) -> tuple[dict[str, Any], dict[str, str]]:
    """The column values to write, and every field's error (by form field name).
    ``current`` is the row: an expiry left as shown is left alone (the form shows it
    to the minute, and an expired key's other limits stay editable)."""
    errors: dict[str, str] = {}
    expires_text = values.get("expiresAt", "").strip()
    unchanged = expires_text == governance_view(current)["form"]["expiresAt"]
    models = [m for m in _SPLIT.split(values.get("allowedModels", "").strip()) if m]
    budget = values.get("budget", "").strip()
    period = values.get("budgetPeriod", "").strip()
    fields = GovernanceFields(
        allowed_models=models or None,
        rpm=_whole(values.get("rpm", "").strip(), errors, "rpm"),
        tpm=_whole(values.get("tpm", "").strip(), errors, "tpm"),
        budget=budget or None,
        budget_period=period or msgspec.UNSET,
        expires_at=msgspec.UNSET if unchanged else _expiry(expires_text, errors),
        labels=_labels(values.get("labels", "").strip(), errors),
    )
    checked, invalid = check_governance(fields, now=now, current_period=current.budget_period)
    for name, error in invalid.items():
        errors.setdefault(name, error.message)
    return checked, {name: errors[name] for name in FIELDS if name in errors}
