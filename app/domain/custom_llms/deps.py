"""Dependency providers of the custom LLMs area (resolved by name by Litestar).

The per-process bundle (directory, guarded HTTP pool, URL guard, sync) is the
``custom_llms`` resource (``app.domain.custom_llms.setup.CustomLlms``), exposed by
``wiring.py``.
"""

from __future__ import annotations

from litestar.di import Provide

from app.domain.custom_llms.services import CustomLlmService
from app.domain.custom_llms.setup import CustomLlms
from app.domain.custom_llms.sync import CustomLlmSync
from app.domain.secrets.services import SecretListener
from app.domain.service_provider import service_provider


def provide_custom_llm_sync(custom_llms: CustomLlms) -> CustomLlmSync:
    return custom_llms.sync


def provide_secret_listeners(custom_llms: CustomLlms) -> tuple[SecretListener, ...]:
    """Cached custom LLMs hold keys opened from secrets: a rotation or deletion on
    this replica drops them before it is answered (``app.domain.secrets``)."""
    return (custom_llms.sync.secret_changed,)


def custom_llms_dependencies() -> dict[str, Provide]:
    return {
        "custom_llms_service": service_provider(CustomLlmService, changes="custom_llm_sync"),
        "custom_llm_sync": Provide(provide_custom_llm_sync, sync_to_thread=False),
        "secret_listeners": Provide(provide_secret_listeners, sync_to_thread=False),
    }
