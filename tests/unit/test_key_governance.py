"""Key governance without a server: model patterns, budgets, the checks a create or
PATCH passes, and a key's minute window in the quota gate's atomic admission."""

from __future__ import annotations

import datetime
from uuid import uuid4

import msgspec
import pytest

from app.domain.accounts.governance import (
    UNRESTRICTED,
    GovernanceFields,
    KeyPolicy,
    ModelNotAllowedError,
    budget_text,
    check_governance,
    parse_budget,
)
from app.domain.calls.admission import allow_model
from app.domain.calls.callers import CallKey
from app.domain.quotas.gate import KeyLimits, QuotaExceededError, QuotaGate
from app.domain.quotas.limits import QuotaLimits, QuotaLimitsCache
from app.lib.state.memory import MemoryStateStore

NOW = datetime.datetime(2026, 12, 7, 12, 0, tzinfo=datetime.UTC)


def policy(models: list[str] | None, **fields: object) -> KeyPolicy:
    values: dict[str, object] = {
        "rpm": None,
        "tpm": None,
        "budget_micros": None,
        "budget_period": None,
        "expires_at": None,
        **fields,
    }
    return KeyPolicy.of(allowed_models=models, **values)  # type: ignore[arg-type]


def test_exact_ids_and_prefixes() -> None:
    limited = policy(["gpt-4o", "claude-*"])
    assert limited.allows("gpt-4o")
    assert not limited.allows("gpt-4o-mini")  # exact means exact
    assert limited.allows("claude-3-opus")
    assert limited.allows("claude-")
    assert not limited.allows("claud")
    assert policy(None).allows("anything")
    assert not policy([]).allows("anything")  # an empty list allows nothing
    assert UNRESTRICTED.allows_any(["x"])


def test_a_refusal_names_the_model_and_what_is_allowed() -> None:
    key = CallKey(uuid4(), policy(["a", "b*"]))
    allow_model(key, ("zzz", "a"))  # any name the call goes by may match
    with pytest.raises(ModelNotAllowedError) as refused:
        allow_model(key, ("zzz",))
    assert refused.value.status_code == 403
    assert refused.value.param == "model"
    assert "'zzz'" in refused.value.message
    assert "a, b*" in refused.value.message


def test_expiry_is_against_the_clock() -> None:
    expiring = policy(None, expires_at=NOW)
    assert not expiring.expired(NOW.timestamp() - 1)
    assert expiring.expired(NOW.timestamp())
    assert not UNRESTRICTED.expired(NOW.timestamp())


@pytest.mark.parametrize(
    ("micros", "text"),
    [(None, None), (0, "0"), (2_500_000, "2.5"), (25_000_000, "25"), (1, "0.000001")],
)
def test_budget_text_is_exact(micros: int | None, text: str | None) -> None:
    assert budget_text(micros) == text


@pytest.mark.parametrize(
    ("value", "micros"),
    [
        ("25.50", 25_500_000),
        (" 3 ", 3_000_000),
        (12, 12_000_000),
        (12.5, 12_500_000),
        (0.1, 100_000),
        (0.00001, 10),  # repr is 1e-05
        (1.123456, 1_123_456),
        ("1.1234567", None),
        (1.1234567, None),  # a JSON number is not rounded to 6 decimals either
        ("-1", None),
        (-1, None),
        (-0.5, None),
        ("1e3", None),
        ("", None),
        (True, None),
        (float("nan"), None),
        (1_000_000_000, 10**15),
        (1_000_000_001, None),
    ],
)
def test_parse_budget_is_exact_or_refuses(value: str | int | float, micros: int | None) -> None:
    assert parse_budget(value) == micros


def test_unsent_fields_are_left_and_null_clears() -> None:
    values, errors = check_governance(GovernanceFields(rpm=None, budget="1.5"), now=NOW)
    assert errors == {}
    assert values == {"rpm": None, "budget_micros": 1_500_000, "budget_period": "month"}
    kept, _ = check_governance(GovernanceFields(budget=2), now=NOW, current_period="day")
    assert kept["budget_period"] == "day"  # a new amount keeps the stored period
    cleared, _ = check_governance(GovernanceFields(budget=None), now=NOW)
    assert cleared == {"budget_micros": None, "budget_period": None}
    assert check_governance(GovernanceFields(), now=NOW) == ({}, {})


def test_every_invalid_field_is_reported() -> None:
    fields = GovernanceFields(
        allowed_models=["ok-*", "*"],
        rpm=-1,
        tpm=3_000_000_000,
        budget="1.2345678",
        budget_period="week",
        expires_at=NOW - datetime.timedelta(seconds=1),
        labels={"": "x"},
    )
    values, errors = check_governance(fields, now=NOW)
    assert set(errors) == {
        "allowedModels",
        "rpm",
        "tpm",
        "budget",
        "budgetPeriod",
        "expiresAt",
        "labels",
    }
    assert errors["expiresAt"].code == "expires_in_past"
    assert "allowed_models" not in values


def test_a_naive_expiry_is_refused() -> None:
    _, errors = check_governance(
        GovernanceFields(expires_at=datetime.datetime(2099, 1, 1)), now=NOW
    )
    assert errors["expiresAt"].code == "invalid_expiry"


def test_the_wire_names_are_camel_case() -> None:
    decoded = msgspec.json.decode(
        b'{"allowedModels": ["a"], "budgetPeriod": "day", "expiresAt": null}',
        type=GovernanceFields,
    )
    assert decoded.allowed_models == ["a"]
    assert decoded.expires_at is None
    assert decoded.rpm is msgspec.UNSET


async def test_a_keys_rpm_is_counted_with_the_project_quota() -> None:
    project, key, other_key = uuid4(), uuid4(), uuid4()

    async def limits(_: object) -> QuotaLimits:
        return QuotaLimits(per_day=10)

    store = MemoryStateStore()
    now = NOW.timestamp()
    gate = QuotaGate(store, QuotaLimitsCache(limits), clock=lambda: now)
    for _ in range(2):
        await gate.check(project, KeyLimits(key, rpm=2))
    with pytest.raises(QuotaExceededError) as refused:
        await gate.check(project, KeyLimits(key, rpm=2))
    assert refused.value.code == "rate_limit_exceeded"
    assert refused.value.headers == {"Retry-After": "60"}
    assert "2 requests per minute" in refused.value.message
    # The refusal counted nowhere: the project's day holds the 2 admitted calls, and
    # another key of the project still has room.
    await gate.check(project, KeyLimits(other_key, rpm=2))
    usage = await gate.usage(project, QuotaLimits(per_day=10))
    assert usage["day"].used == 3
    # Outside the project quota (a custom LLM), the key's rate still applies.
    with pytest.raises(QuotaExceededError):
        await gate.check(project, KeyLimits(key, rpm=2), project_quota=False)
    assert (await gate.usage(project, QuotaLimits(per_day=10)))["day"].used == 3


async def test_the_project_refusal_wins_when_its_own_window_is_full() -> None:
    project, key = uuid4(), uuid4()

    async def limits(_: object) -> QuotaLimits:
        return QuotaLimits(per_day=1)

    now = NOW.timestamp()
    gate = QuotaGate(MemoryStateStore(), QuotaLimitsCache(limits), clock=lambda: now)
    await gate.check(project, KeyLimits(key, rpm=100))
    with pytest.raises(QuotaExceededError) as refused:
        await gate.check(project, KeyLimits(key, rpm=100))
    assert refused.value.code == "quota_exceeded"
    assert refused.value.window == "day"
