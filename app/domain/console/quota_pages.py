"""The Quotas and usage tab: the limits in force per window (requests, tokens, money)
with what the current windows used, the owner's own lower limits, and the project's
usage over the last days (per day and per model), as server-drawn charts beside their
tables. The limits' view is in ``quota_view``."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from litestar import get, post
from litestar.response import Template

from app.domain.console.charts import bar_chart, column_chart
from app.domain.console.tab_support import Forms, FormState, Tab, TabPages, TabScope, parse
from app.domain.prices import amounts
from app.domain.prices.schemas import PriceIn
from app.domain.prices.services import ModelPriceService, price_out
from app.domain.quotas.fields import WIRE_NAMES, read_limits
from app.domain.quotas.gate import QuotaGate
from app.domain.quotas.page_view import form_values, limit_views, sections
from app.domain.quotas.services import ProjectQuotaService
from app.domain.quotas.views import quota_out
from app.domain.usage.schemas import UsageGroupOut
from app.domain.usage.services import UsageFilters, UsageRecordService
from app.lib.clock import utcnow
from app.lib.errors import AronaError

KEY = "quota"
FORM = "owner-limits"
PRICE_FORM = "own-price"
PRICE_FIELDS = ("model", "input", "cachedInput", "output", "currency")
PRICES_SHOWN = 100
PERIODS = (7, 30, 90)
DEFAULT_DAYS = 30
MODELS_SHOWN = 12


def _cost(group: UsageGroupOut) -> str:
    return amounts.label(group.cost_micros, group.currency, estimated=group.cost_estimated)


def _days(since: datetime.date, count: int) -> list[str]:
    return [(since + datetime.timedelta(days=i)).isoformat() for i in range(count)]


async def _usage(usage_service: UsageRecordService, project_id: UUID, days: int) -> dict[str, Any]:
    today = utcnow().date()
    first = today - datetime.timedelta(days=days - 1)
    since = datetime.datetime.combine(first, datetime.time(), tzinfo=datetime.UTC)
    filters = UsageFilters(since=since)
    per_day, totals = await usage_service.summary(project_id, filters, "day")
    per_model, _ = await usage_service.summary(project_id, filters, "model")
    by_day = {a.key: a for a in per_day}
    keys = _days(first, days)
    rows: list[dict[str, Any]] = [
        {
            "day": key,
            "requests": by_day[key].requests if key in by_day else 0,
            "tokens": by_day[key].total_tokens if key in by_day else 0,
            "errors": by_day[key].errors if key in by_day else 0,
            "cost": _cost(by_day[key]) if key in by_day else "0",
        }
        for key in keys
    ]
    short = [key[5:] for key in keys]  # MM-DD
    models = per_model[:MODELS_SHOWN]
    return {
        "days": days,
        "periods": PERIODS,
        "since": first.isoformat(),
        "day_rows": rows,
        "model_rows": models,
        "models_total": len(per_model),
        "totals": totals,
        "totals_cost": _cost(totals),
        "model_costs": [_cost(m) for m in models],
        "requests_chart": column_chart(
            [(r["day"], r["requests"]) for r in rows], unit="requests", short_labels=short
        ),
        "tokens_chart": column_chart(
            [(r["day"], r["tokens"]) for r in rows], unit="tokens", short_labels=short
        ),
        "models_chart": bar_chart([(m.key or "", m.requests) for m in models], unit="requests"),
    }


async def _context(
    scope: TabScope,
    services: TabServices,
    days: int,
) -> dict[str, Any]:
    quotas_service, quota_gate = services.quotas, services.gate
    project_id = scope.project.id
    row = await quotas_service.of_project(project_id)
    quota = await quota_out(project_id, row, quota_gate)
    views = limit_views(quota)
    prices, _ = await services.prices.page_of(project_id, PRICES_SHOWN, 0)
    now = utcnow()
    current = form_values(quota.owner_limits)
    return {
        "sections": sections(views),
        "fail_closed": quota.fail_closed,
        "currency": quota.currency,
        "forms": Forms({FORM: FormState(values=current), PRICE_FORM: FormState(values=_blank())}),
        "prices": [price_out(row, now) for row in prices],
        **await _usage(services.usage, project_id, days),
    }


def _period(days: int | None) -> int:
    return days if days in PERIODS else DEFAULT_DAYS


@dataclass(frozen=True, slots=True)
class TabServices:
    """What the tab reads: the quota, its live windows, usage and the own prices."""

    quotas: ProjectQuotaService
    gate: QuotaGate
    usage: UsageRecordService
    prices: ModelPriceService


def _blank() -> dict[str, str]:
    return {"currency": "USD"}


def _tab(scope: TabScope, services: TabServices, days: int) -> Tab:
    """The tab with the usage of the last ``days``."""
    return scope.tab(KEY, lambda: _context(scope, services, days))


class QuotaTab(TabPages):
    @get("/tabs/quota")
    async def show(
        self,
        tab_scope: TabScope,
        project_quotas_service: ProjectQuotaService,
        quota_gate: QuotaGate,
        usage_records_service: UsageRecordService,
        prices_service: ModelPriceService,
        days: int | None = None,
    ) -> Template:
        services = TabServices(
            project_quotas_service, quota_gate, usage_records_service, prices_service
        )
        return await _tab(tab_scope, services, _period(days)).show()

    @post("/quota")
    async def set_owner_limits(
        self,
        tab_scope: TabScope,
        project_id: UUID,
        project_quotas_service: ProjectQuotaService,
        quota_gate: QuotaGate,
        usage_records_service: UsageRecordService,
        prices_service: ModelPriceService,
    ) -> Template:
        tab_scope.require_project("change the project's quota")
        form = await tab_scope.form()
        values = form.texts(*WIRE_NAMES)
        days = _period(int(form.text("days")) if form.text("days").isdigit() else None)
        services = TabServices(
            project_quotas_service, quota_gate, usage_records_service, prices_service
        )
        tab = _tab(tab_scope, services, days)
        # Every field at once: what is not a valid limit, and what is above the admin's.
        limits, problems = read_limits(values)
        above = await project_quotas_service.above_admin(project_id, limits)
        errors = {
            wire: (problems.get(wire) or above[wire]).plain
            for wire in WIRE_NAMES
            if wire in problems or wire in above
        }
        if errors:
            return await tab.reject(FORM, FormState(values=values, errors=errors, failed=True))
        try:
            await project_quotas_service.set_owner_limits(project_id, limits)
        except AronaError as exc:
            return await tab.refuse(FORM, exc, WIRE_NAMES, values)
        return await tab.show("Your limits are saved.")

    @post("/prices")
    async def add_own_price(
        self,
        tab_scope: TabScope,
        project_id: UUID,
        project_quotas_service: ProjectQuotaService,
        quota_gate: QuotaGate,
        usage_records_service: UsageRecordService,
        prices_service: ModelPriceService,
    ) -> Template:
        """A price of the project's own (its custom LLMs and override-key calls)."""
        tab_scope.require_project("set the project's prices")
        form = await tab_scope.form()
        values = form.texts(*PRICE_FIELDS)
        days = _period(int(form.text("days")) if form.text("days").isdigit() else None)
        services = TabServices(
            project_quotas_service, quota_gate, usage_records_service, prices_service
        )
        tab = _tab(tab_scope, services, days)
        body = {name: value for name, value in values.items() if value}
        try:
            data = parse(PriceIn, body)
            row = await prices_service.add(project_id, data)
        except AronaError as exc:
            return await tab.refuse(PRICE_FORM, exc, PRICE_FIELDS, values)
        return await tab.show(f"Price of {row.model} added.")
