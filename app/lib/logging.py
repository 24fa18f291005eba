"""Structured logging (structlog) configured once at start-up from settings."""

from __future__ import annotations

import logging
import sys

import structlog

from app.lib.settings import Settings


def configure_logging(settings: Settings) -> None:
    level = logging.getLevelNamesMapping().get(settings.log_level, logging.INFO)
    renderer: structlog.typing.Processor
    if settings.log_format == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # Route stdlib loggers (uvicorn, sqlalchemy, alembic) at the same level.
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    # httpx/httpcore log every upstream request at INFO: one line per relayed call
    # (and per probe) is noise and costs CPU on the hot path. Failures are ours to log.
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(max(level, logging.WARNING))
