"""The wiring vocabulary areas declare themselves in (``app.lib.components``)."""

from __future__ import annotations

import asyncio

import pytest

from app.lib.components import BackgroundTask, Component, Provides, periodic, provided


class _Area(Component):
    name = "area"

    def provides(self) -> dict[str, object]:
        return {"cache": "the cache"}


async def test_a_component_does_nothing_unless_it_says_so() -> None:
    component = Component()
    assert component.provides() == {}
    assert list(component.tasks()) == []
    await component.start()
    await component.ready()
    await component.seed_after_outage()
    await component.resync_after_outage()
    await component.stop()
    await component.aclose()


def test_provided_merges_every_component_in_order() -> None:
    merged = provided([_Area(), Provides("other", {"index": 1, "sync": 2})])
    assert merged == {"cache": "the cache", "index": 1, "sync": 2}
    assert list(merged) == ["cache", "index", "sync"]


def test_a_name_provided_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="'cache' provided twice"):
        provided([_Area(), Provides("clash", {"cache": "another"})])


async def test_periodic_calls_its_body_every_interval() -> None:
    calls: list[int] = []
    third_call = asyncio.Event()

    async def body() -> None:
        calls.append(1)
        if len(calls) == 3:
            third_call.set()

    task_spec = periodic("tick", 0.01, body)
    assert isinstance(task_spec, BackgroundTask)
    assert task_spec.name == "tick"
    assert task_spec.task_name is None

    async def run() -> None:
        await task_spec.run()

    task = asyncio.create_task(run())
    await asyncio.wait_for(third_call.wait(), 5.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
