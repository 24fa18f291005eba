"""Usage as CSV: a project's records and its spend summary, for spreadsheets and
billing scripts. Costs are exact decimal text (from ``cost_micros``); a text cell that
a spreadsheet would run as a formula (``=``, ``+``, ``-``, ``@``) is quoted with a
leading apostrophe (model names and conversation ids come from callers)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any

from app.db.models import UsageRecord
from app.domain.prices import amounts
from app.domain.usage.schemas import UsageGroupOut

MAX_EXPORT_ROWS = 100_000
"""Past this an export is refused (400): narrow it with ``from`` / ``to``."""
RECORD_COLUMNS = (
    "createdAt",
    "id",
    "modelRequested",
    "modelServed",
    "backend",
    "endpoint",
    "streamed",
    "status",
    "errorCode",
    "promptTokens",
    "completionTokens",
    "totalTokens",
    "estimated",
    "cost",
    "currency",
    "costEstimated",
    "apiKeyId",
    "userId",
    "conversationId",
    "modelProfileId",
    "isCustom",
    "isOverrideKey",
    "latencyMs",
    "ttftMs",
)
SUMMARY_COLUMNS = (
    "key",
    "requests",
    "promptTokens",
    "completionTokens",
    "totalTokens",
    "errors",
    "cost",
    "currency",
    "costEstimated",
)
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = value if isinstance(value, str) else str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


def _csv(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow([_cell(value) for value in row])
    return out.getvalue().encode()


def _cost(micros: int | None) -> str | None:
    return None if micros is None else amounts.text(micros)


def records_csv(records: Iterable[UsageRecord]) -> bytes:
    return _csv(
        RECORD_COLUMNS,
        (
            (
                r.created_at.isoformat(),
                r.id,
                r.model_requested,
                r.model_served,
                r.backend,
                r.endpoint,
                r.streamed,
                r.status,
                r.error_code,
                r.prompt_tokens,
                r.completion_tokens,
                r.total_tokens,
                r.estimated,
                _cost(r.cost_micros),
                r.currency,
                r.cost_estimated,
                r.api_key_id,
                r.user_id,
                r.conversation_id,
                r.model_profile_id,
                r.is_custom,
                r.is_override_key,
                r.latency_ms,
                r.ttft_ms,
            )
            for r in records
        ),
    )


def summary_csv(groups: Iterable[UsageGroupOut], totals: UsageGroupOut) -> bytes:
    """One line per group, then the totals as the line whose key is ``(total)``."""

    def line(group: UsageGroupOut, key: str | None) -> tuple[Any, ...]:
        return (
            key,
            group.requests,
            group.prompt_tokens,
            group.completion_tokens,
            group.total_tokens,
            group.errors,
            _cost(group.cost_micros),
            group.currency,
            group.cost_estimated,
        )

    return _csv(SUMMARY_COLUMNS, [*(line(g, g.key) for g in groups), line(totals, "(total)")])
