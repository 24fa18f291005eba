"""``arona vault rotate``: move every encrypted column to the newest vault key.

Runs beside serving replicas. Each column is read in batches ordered by id (short
read transactions), each value is decrypted with whichever configured key sealed it
and sealed again under the newest, and written back with a compare-and-set on the
old ciphertext::

    UPDATE <table> SET <col> = :new WHERE id = :id AND <col> = :old

so a value written meanwhile by a server (a rotated secret, a re-registered backend)
is never overwritten with the old plaintext. Such a row is re-read and, if it is not
on the newest key yet, resealed again (a few attempts). Rows already on the newest
key are left alone, which makes the command idempotent: a second run reports every
row as current. ``updated_at`` is not touched: the stored value did not change.

A value that cannot be decrypted (its key id is not configured, or it was tampered
with or copied from another row) is reported as failed, by table, row id and key id,
never by value; the run goes on with the other rows and ends non-zero.

Once a run reports no failures and every server runs with the newest key first,
older keys can be removed from ARONA_VAULT_KEYS. Servers must already list the
newest key before the run (newest first): a server whose ring lacks it cannot read
the rows this command moved to it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from uuid import UUID

from sqlalchemy import Column, RowMapping, Table, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.models import BackendConfig, CustomLlm, OverrideKey, ProjectSecret, ProjectWebhook
from app.domain.secrets.aad import (
    backend_config_aad,
    custom_llm_aad,
    override_key_aad,
    secret_aad,
    webhook_previous_aad,
    webhook_secret_aad,
)
from app.lib.vault import Vault, VaultDecryptError, VaultError, VaultKeyMissingError

DEFAULT_BATCH_SIZE = 200
MAX_ATTEMPTS = 5
"""Compare-and-set attempts for one row that keeps being written concurrently."""

BatchHook = Callable[[str, Sequence[UUID]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class EncryptedColumn:
    """One encrypted column and the associated data of its rows."""

    table: Table
    column: str
    aad_of: Callable[[RowMapping], bytes]
    """Associated data from the row's ``id`` (and ``project_id`` where it has one)."""
    label: str | None = None
    """How the report names it when its table has another encrypted column too."""

    @property
    def name(self) -> str:
        return self.label or self.table.name

    @property
    def col(self) -> Column[str]:
        column: Column[str] = self.table.c[self.column]
        return column

    @property
    def owner_cols(self) -> list[Column[UUID]]:
        names = ["id", "project_id"] if "project_id" in self.table.c else ["id"]
        return [self.table.c[n] for n in names]


def _table(model: type) -> Table:
    table = model.__table__  # type: ignore[attr-defined]
    assert isinstance(table, Table)
    return table


ENCRYPTED_COLUMNS: tuple[EncryptedColumn, ...] = (
    EncryptedColumn(
        _table(BackendConfig), "api_key_encrypted", lambda r: backend_config_aad(r["id"])
    ),
    EncryptedColumn(
        _table(ProjectSecret),
        "value_encrypted",
        lambda r: secret_aad(r["project_id"], r["id"]),
    ),
    EncryptedColumn(
        _table(CustomLlm),
        "api_key_encrypted",
        lambda r: custom_llm_aad(r["project_id"], r["id"]),
    ),
    EncryptedColumn(
        _table(OverrideKey),
        "key_encrypted",
        lambda r: override_key_aad(r["project_id"], r["id"]),
    ),
    EncryptedColumn(
        _table(ProjectWebhook),
        "secret_encrypted",
        lambda r: webhook_secret_aad(r["project_id"], r["id"]),
    ),
    EncryptedColumn(
        _table(ProjectWebhook),
        "previous_secret_encrypted",
        lambda r: webhook_previous_aad(r["project_id"], r["id"]),
        label="project_webhooks.previous",
    ),
)
"""Every encrypted column in the database. A new one must be added here."""


@dataclass(frozen=True, slots=True)
class RowFailure:
    table: str
    row_id: UUID
    kid: str | None
    """The key id the value names, when it could be read from the token."""
    reason: str
    """What went wrong; never contains the value or key material."""

    def describe(self) -> str:
        return f"{self.table} {self.row_id}: {self.reason}"


@dataclass(slots=True)
class TableReport:
    table: str
    rotated: int = 0
    """Resealed under the newest key (in a dry run: would be)."""
    current: int = 0
    """Already on the newest key (including rows a server rewrote meanwhile)."""
    failed: int = 0
    gone: int = 0
    """Deleted by a server between the read and the write."""


@dataclass(slots=True)
class RotationReport:
    newest_kid: str
    dry_run: bool
    tables: list[TableReport] = field(default_factory=list)
    failures: list[RowFailure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def rotated(self) -> int:
        return sum(t.rotated for t in self.tables)

    @property
    def current(self) -> int:
        return sum(t.current for t in self.tables)


class _Failed(Exception):
    def __init__(self, kid: str | None, reason: str) -> None:
        super().__init__(reason)
        self.kid = kid
        self.reason = reason


def _reseal(vault: Vault, token: str, aad: bytes) -> str | None:
    """The token under the newest key, or None when it already is; ``_Failed`` if
    it cannot be opened."""
    try:
        kid = vault.key_id_of(token)
    except VaultDecryptError as exc:
        raise _Failed(None, str(exc)) from None
    if kid == vault.newest_kid:
        return None
    try:
        return vault.reencrypt(token, aad)
    except VaultKeyMissingError:
        raise _Failed(
            kid,
            f"vault key {kid!r} is not configured: add it to ARONA_VAULT_KEYS (after "
            "the newest key) and run again",
        ) from None
    except VaultError as exc:
        raise _Failed(kid, str(exc)) from None


async def _compare_and_set(
    conn: AsyncConnection, target: EncryptedColumn, row_id: UUID, old: str, new: str
) -> bool:
    result = await conn.execute(
        update(target.table)
        .where(target.table.c.id == row_id, target.col == old)
        .values({target.column: new})
    )
    return bool(result.rowcount == 1)


async def _settle_raced(
    engine: AsyncEngine, vault: Vault, target: EncryptedColumn, row_id: UUID, report: TableReport
) -> RowFailure | None:
    """A row whose compare-and-set missed: a server wrote it meanwhile. Re-read it and
    reseal what is there now, until the write lands or the row is current or gone."""
    for _ in range(MAX_ATTEMPTS):
        async with engine.begin() as conn:
            row = (
                (
                    await conn.execute(
                        select(*target.owner_cols, target.col).where(target.table.c.id == row_id)
                    )
                )
                .mappings()
                .first()
            )
            token = None if row is None else row[target.column]
            if row is None or token is None:
                report.gone += 1
                return None
            try:
                new = _reseal(vault, token, target.aad_of(row))
            except _Failed as exc:
                return RowFailure(target.name, row_id, exc.kid, exc.reason)
            if new is None:
                report.current += 1
                return None
            if await _compare_and_set(conn, target, row_id, token, new):
                report.rotated += 1
                return None
    return RowFailure(
        target.name, row_id, None, f"kept changing during {MAX_ATTEMPTS} attempts; run again"
    )


async def _rotate_column(
    engine: AsyncEngine,
    vault: Vault,
    target: EncryptedColumn,
    *,
    batch_size: int,
    dry_run: bool,
    on_batch: BatchHook | None,
    failures: list[RowFailure],
) -> TableReport:
    report = TableReport(target.name)
    id_col = target.table.c.id
    last_id: UUID | None = None
    while True:
        query = (
            select(*target.owner_cols, target.col)
            .where(target.col.is_not(None))
            .order_by(id_col)
            .limit(batch_size)
        )
        if last_id is not None:
            query = query.where(id_col > last_id)
        async with engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        if not rows:
            return report
        last_id = rows[-1]["id"]
        pending: list[tuple[UUID, str, str]] = []
        for row in rows:
            try:
                new = _reseal(vault, row[target.column], target.aad_of(row))
            except _Failed as exc:
                report.failed += 1
                failures.append(RowFailure(target.name, row["id"], exc.kid, exc.reason))
                continue
            if new is None:
                report.current += 1
            else:
                pending.append((row["id"], row[target.column], new))
        if on_batch is not None:
            await on_batch(target.name, [row_id for row_id, _, _ in pending])
        if dry_run:
            report.rotated += len(pending)
            continue
        raced: list[UUID] = []
        async with engine.begin() as conn:
            for row_id, old, new in pending:
                if await _compare_and_set(conn, target, row_id, old, new):
                    report.rotated += 1
                else:
                    raced.append(row_id)
        for row_id in raced:
            failure = await _settle_raced(engine, vault, target, row_id, report)
            if failure is not None:
                report.failed += 1
                failures.append(failure)


async def rotate_vault(
    engine: AsyncEngine,
    vault: Vault,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dry_run: bool = False,
    columns: Sequence[EncryptedColumn] = ENCRYPTED_COLUMNS,
    on_batch: BatchHook | None = None,
) -> RotationReport:
    """Reseal every value of ``columns`` not yet under ``vault.newest_kid``.

    ``dry_run`` decrypts and counts without writing. ``on_batch(table, row_ids)``
    runs after each batch is read and resealed, before it is written (tests use it
    to write concurrently).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    report = RotationReport(newest_kid=vault.newest_kid, dry_run=dry_run)
    for target in columns:
        report.tables.append(
            await _rotate_column(
                engine,
                vault,
                target,
                batch_size=batch_size,
                dry_run=dry_run,
                on_batch=on_batch,
                failures=report.failures,
            )
        )
    return report


def render_report(report: RotationReport, kids: Sequence[str]) -> list[str]:
    """The command's output: a table of counts, then one line per failed row."""
    verb = "would rotate" if report.dry_run else "rotated"
    dry = "; dry run, nothing written" if report.dry_run else ""
    lines = [
        f"vault rotate: newest key {report.newest_kid!r} (configured: {', '.join(kids)}){dry}",
        f"{'table':<26}{verb:>14}{'current':>10}{'failed':>9}",
    ]
    for t in report.tables:
        gone = f"  ({t.gone} deleted meanwhile)" if t.gone else ""
        lines.append(f"{t.table:<26}{t.rotated:>14}{t.current:>10}{t.failed:>9}{gone}")
    for failure in report.failures:
        lines.append(f"failed: {failure.describe()}")
    if report.failures:
        missing = sorted({f.kid for f in report.failures if f.kid and f.kid not in kids})
        hint = (
            f" (missing key{'s' if len(missing) > 1 else ''}: {', '.join(missing)})"
            if missing
            else ""
        )
        lines.append(
            f"{len(report.failures)} value(s) could not be rotated{hint}: keep every "
            "old key in ARONA_VAULT_KEYS until a run reports none"
        )
    elif not report.dry_run:
        older = [k for k in kids if k != report.newest_kid]
        tail = (
            f": {', '.join(repr(k) for k in older)} can be removed from ARONA_VAULT_KEYS "
            f"once every server lists {report.newest_kid!r} first"
            if older
            else ""
        )
        lines.append(f"every encrypted value is on key {report.newest_kid!r}{tail}")
    return lines
