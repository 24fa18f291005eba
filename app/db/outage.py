"""Telling "the database is unreachable" from other database errors.

A replica rides out a database outage on its caches (see docs/deployment.md,
"Database down"); what needs the database then fails with one clear error:
``DatabaseUnavailableError`` (503 ``database_unavailable`` with ``Retry-After``).
``is_database_outage`` recognises the errors an outage produces, wherever they
surface: SQLAlchemy's connection errors (``OperationalError``, ``InterfaceError``,
an invalidated connection, the pool's ``TimeoutError``), asyncpg's connection errors
(the server starting up or out of connections included), and refused, reset or timed
out sockets raised from the driver. advanced-alchemy's repository errors wrap these;
the whole cause chain is searched.
"""

from __future__ import annotations

import types
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

import asyncpg
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine

from app.lib.errors import ServiceUnavailableError

RETRY_AFTER_SECONDS = 5
WRITE_NOT_SAVED = "the database is unreachable; this change was not saved — retry shortly"
_MAX_CHAIN = 16

_ASYNCPG_OUTAGES: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,  # connection lost mid-operation, refused by the server
    asyncpg.CannotConnectNowError,  # starting up, shutting down, in recovery
    asyncpg.TooManyConnectionsError,
)
_SOCKET_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,  # refused, reset, aborted, broken pipe
    TimeoutError,
)
_DRIVER_MODULES = ("sqlalchemy.", "asyncpg.", "aiosqlite.")


class DatabaseUnavailableError(ServiceUnavailableError):
    """The database cannot be reached; nothing was read or written. Retry later."""

    default_code = "database_unavailable"

    def __init__(self, message: str = WRITE_NOT_SAVED, **kwargs: Any) -> None:
        headers = dict(kwargs.pop("headers", None) or {})
        headers.setdefault("Retry-After", str(RETRY_AFTER_SECONDS))
        super().__init__(message, headers=headers, **kwargs)


def _raised_by_driver(exc: BaseException) -> bool:
    """Whether a plain socket error came out of the database driver (not, say, an
    upstream call): one of its frames is in SQLAlchemy, asyncpg or aiosqlite."""
    tb: types.TracebackType | None = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if isinstance(module, str) and module.startswith(_DRIVER_MODULES):
            return True
        tb = tb.tb_next
    return False


def _is_outage_itself(exc: BaseException) -> bool:
    if isinstance(exc, DatabaseUnavailableError):
        return True
    if isinstance(exc, sa_exc.TimeoutError):  # no pooled connection came free in time
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        return exc.connection_invalidated or isinstance(
            exc, sa_exc.OperationalError | sa_exc.InterfaceError
        )
    if isinstance(exc, _ASYNCPG_OUTAGES):
        return True
    return isinstance(exc, _SOCKET_ERRORS) and _raised_by_driver(exc)


def is_database_outage(exc: BaseException) -> bool:
    """Whether ``exc`` (or anything in its cause chain) says the database is unreachable."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending and len(seen) < _MAX_CHAIN:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if _is_outage_itself(current):
            return True
        for linked in (
            current.__cause__,
            current.__context__,
            getattr(current, "orig", None),  # SQLAlchemy's DBAPIError
        ):
            if isinstance(linked, BaseException):
                pending.append(linked)
    return False


P = ParamSpec("P")
T = TypeVar("T")


def unavailable_on_outage(
    call: Callable[P, Awaitable[T]], message: str
) -> Callable[P, Awaitable[T]]:
    """``call`` with an outage turned into ``DatabaseUnavailableError(message)``, so a
    cold cache on the request path answers a clear 503 (and the gateway meters it
    like any refused call) rather than an internal error."""

    async def wrapped(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await call(*args, **kwargs)
        except DatabaseUnavailableError:
            raise
        except Exception as exc:
            if is_database_outage(exc):
                raise DatabaseUnavailableError(message) from exc
            raise

    return wrapped


def install_connect_errors(engine: AsyncEngine) -> None:
    """Make a failed connect a SQLAlchemy ``OperationalError``.

    asyncpg raises plain ``OSError``/``TimeoutError`` when the server refuses or does
    not answer, and SQLAlchemy passes those through unwrapped; as DBAPI errors they
    are recognisable (and SQLAlchemy's pool handles them like any connect failure).
    """
    if engine.dialect.name == "sqlite":
        return

    @event.listens_for(engine.sync_engine, "do_connect")
    def _connect(dialect: Dialect, _record: Any, cargs: Any, cparams: Any) -> Any:
        try:
            return dialect.connect(*cargs, **cparams)
        except (OSError, TimeoutError) as exc:
            dbapi = dialect.loaded_dbapi
            raise dbapi.OperationalError(f"cannot connect to the database: {exc!r}") from exc
