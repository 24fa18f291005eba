"""The budgets page: the newest budget threshold alerts of every project (or of one),
live.

Routes::

    GET  /admin/budgets?project=<id>          the page (``project``: only its alerts)
    GET  /admin/stream/budgets?project=<id>   text/event-stream (``BudgetsFeed``, in ``pages``)
"""

from __future__ import annotations

from uuid import UUID

from litestar import get
from litestar.response import Template

from app.domain.dashboard.budget_alerts import KEEP, AlertHistory
from app.domain.dashboard.budget_views import NameBook, alert_views
from app.domain.dashboard.common import AdminRequest, DashboardController


class BudgetPages(DashboardController):
    @get("/budgets")
    async def budgets_page(
        self, admin: AdminRequest, budget_alert_log: AlertHistory, project: UUID | None = None
    ) -> Template:
        names = NameBook(admin.db_config)
        if project is not None:
            await names.learn((), [project])  # named even when it has no alert yet
        alerts = await alert_views(budget_alert_log, names, project)
        return admin.page(
            "dashboard/budgets.html",
            "budgets",
            alerts=alerts,
            filtered=project is not None,
            project_id=project,
            project_name=None if project is None else names.projects[project],
            keep=KEEP,
        )
