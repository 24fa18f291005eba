"""The in-process server the tests run Arona in: a failed start-up is an error of the
test that asked for it, never an exit that takes the shared event loop down."""

from __future__ import annotations

import asyncio

import pytest

from app.lib.settings import Settings
from tests.support.live_server import live_server
from tests.support.settings import AppFactory, base_settings


async def test_a_failed_start_up_is_an_error_and_the_loop_goes_on(
    make_app: AppFactory, tmp_path
) -> None:
    unmigrated: Settings = base_settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
    )
    with pytest.raises(RuntimeError, match="start-up failed") as failed:
        async with live_server(make_app(unmigrated)):
            pytest.fail("an unmigrated database must stop the start-up")
    assert isinstance(failed.value.__cause__, SystemExit)
    # The loop that ran the failed server still runs tasks.
    assert await asyncio.wait_for(asyncio.sleep(0, result="alive"), 1) == "alive"
