"""Structured logging (structlog) configured once at start-up from settings.

Two paths reach stderr in one format. Arona's own events go through structlog
directly (no stdlib ``LogRecord`` on the hot path). Everything logged through the
standard library (uvicorn, SQLAlchemy, Alembic, websockets) goes through a handler on
the root logger whose ``ProcessorFormatter`` runs the same processors, so with
``ARONA_LOG_FORMAT=json`` every line is one JSON object a log pipeline can parse, and
both carry the request id bound for the current request.
"""

from __future__ import annotations

import logging
import sys

import structlog

from app.lib.settings import Settings


class _AronaHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record is emitted (a stream captured
    at configuration time may be closed by then). Its class marks the handler this
    module installed, so configuring again (an app is built more than once per process
    in tests) replaces it and leaves other handlers alone."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        """Set by ``StreamHandler.__init__``; the live ``sys.stderr`` is used instead."""


def _renderer(settings: Settings) -> structlog.typing.Processor:
    if settings.log_format == "json":
        return structlog.processors.JSONRenderer()
    return structlog.dev.ConsoleRenderer(colors=False)


def configure_logging(settings: Settings) -> None:
    level = logging.getLevelNamesMapping().get(settings.log_level, logging.INFO)
    renderer = _renderer(settings)
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )

    handler = _AronaHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for installed in [h for h in root.handlers if isinstance(h, _AronaHandler)]:
        root.removeHandler(installed)
    root.addHandler(handler)
    root.setLevel(level)
    # uvicorn's own logging config (installed when uvicorn runs the app with its
    # defaults, e.g. `uvicorn app.server.asgi:app`) gives its loggers their own
    # plain-text handlers and stops propagation: take them back, one format for all.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        server_logger = logging.getLogger(name)
        server_logger.handlers.clear()
        server_logger.propagate = True
    # httpx/httpcore log every upstream request at INFO: one line per relayed call
    # (and per probe) is noise and costs CPU on the hot path. Failures are ours to log.
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(max(level, logging.WARNING))
