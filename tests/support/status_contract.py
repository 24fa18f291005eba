"""The documented error statuses of every route stay complete: a contract kept by the
whole suite.

After each test, every app it built through ``make_app`` is read: each (method, route,
status) it actually answered with an error status is looked up in the app's OpenAPI
document (the same for every app; read once). When the session ends, the misses
are reported. A status a test produced that the document does
not list fails the session (an error at the teardown of the last test), naming the
operation and the status. Routes left out of the document (pages, the raw ``/v1``
relay, JSON-RPC) are skipped; a 500 ``internal_error`` is a bug, not a contract, and
is caught by the tests that cause it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from litestar import Litestar

_PARAMETER_TYPE = re.compile(r"\{([^}:]+):[^}]+\}")
CHECKED_FROM = 400


def openapi_path(route: str) -> str:
    """``/api/projects/{project_id:uuid}`` as the document names it."""
    return _PARAMETER_TYPE.sub(r"{\1}", route)


@dataclass
class StatusContract:
    missing: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    """Undocumented error statuses seen so far, by (method, documented path)."""
    _paths: dict[str, Any] | None = None

    def record(self, app: Litestar) -> None:
        observed = app.state.resources.metrics.observed()
        errors = [o for o in observed if o[2] >= CHECKED_FROM and o[2] != 500]
        if not errors:
            return
        if self._paths is None:
            self._paths = app.openapi_schema.to_schema().get("paths", {})
        for method, route, status in errors:
            operation = self._paths.get(openapi_path(route), {}).get(method.lower())
            if operation is None:
                continue  # not in the document: pages, raw ASGI routes
            if str(status) not in operation.get("responses", {}):
                self.missing.setdefault((method, openapi_path(route)), set()).add(status)

    def report(self) -> str:
        lines = [
            f"  {method} {path}: {', '.join(str(s) for s in sorted(statuses))}"
            for (method, path), statuses in sorted(self.missing.items())
        ]
        return "\n".join(lines)
