"""The settings tabs of a project's console page, each served at
``GET /projects/{projectId}/tabs/{key}`` (a fragment swapped into ``#tab-panel`` for
HTMX, the whole project page with the tab in it otherwise) with its writes beside it:

- ``overview``: rename, delete (confirmed by typing the name), members;
- ``custom-llms``: add from the Bob or Custom template, enable/disable, test, delete;
- ``secrets`` and ``overrides``: write-only values, shown masked;
- ``quota``: limits and current windows, the owner's limits, usage charts;
- ``keys``: API keys and runtime tokens (a new one shown once);
- ``models``: enabled profiles, the default, the runtime catalog;
- ``conversations``: profile, priority and fallback pins;
- ``webhooks``: threshold event receivers, their secrets and delivery log.

Every handler checks access through ``ProjectService.access`` (another project is a
404) and leaves the rules to the area's services; ``csrf_guard`` refuses writes
without the session's token.
"""

from __future__ import annotations

from litestar import Controller

from app.domain.console.key_pages import KeysTab
from app.domain.console.llm_pages import CustomLlmTab
from app.domain.console.model_pages import ConversationsTab, ModelsTab
from app.domain.console.overview_pages import OverviewTab
from app.domain.console.quota_pages import QuotaTab
from app.domain.console.secret_pages import OverridesTab, SecretsTab
from app.domain.console.webhook_pages import WebhooksTab

TAB_CONTROLLERS: tuple[type[Controller], ...] = (
    OverviewTab,
    CustomLlmTab,
    SecretsTab,
    OverridesTab,
    QuotaTab,
    KeysTab,
    ModelsTab,
    ConversationsTab,
    WebhooksTab,
)
