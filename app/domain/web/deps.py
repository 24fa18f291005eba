"""Dependency providers of the HTML faces (resolved by name by Litestar)."""

from __future__ import annotations

from litestar.di import Provide

from app.domain.web.pages import provide_web_admin, provide_web_session, provide_web_user


def web_dependencies() -> dict[str, Provide]:
    return {
        "web_session": Provide(provide_web_session),
        "web_user": Provide(provide_web_user),
        "web_admin": Provide(provide_web_admin),
    }
