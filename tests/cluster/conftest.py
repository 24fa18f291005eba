"""Fixtures for the replica-cluster tests: three ``arona serve`` processes per module
on a database of the module's own, and fake upstreams served in the test process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator

import pytest

from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from tests.support.cluster import Cluster, Tenant, new_tenant, running_cluster, unique


@pytest.fixture(scope="module")
async def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Cluster]:
    """A module may set ``CLUSTER_ENV`` (``ARONA_*`` values for every replica) and
    ``REPLICA_ENV`` (a list: replica A's, B's and C's own values)."""
    extra_env: dict[str, str] = getattr(request.module, "CLUSTER_ENV", {})
    per_replica: list[dict[str, str]] = getattr(request.module, "REPLICA_ENV", [])
    async with running_cluster(
        tmp_path_factory.mktemp("cluster"), extra_env=extra_env, per_replica_env=per_replica
    ) as started:
        yield started


@pytest.fixture
async def tenant(cluster: Cluster) -> Tenant:
    return await new_tenant(cluster.a)


@pytest.fixture(autouse=True)
def dump_logs_on_failure(request: pytest.FixtureRequest) -> object:
    """Attach the replicas' output to a failing test's report."""
    yield None
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed and "cluster" in request.fixturenames:
        started: Cluster = request.getfixturevalue("cluster")
        print(started.logs())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[FakeOpenAI, str]]:
    """A fake OpenAI-compatible server with a model name of its own."""
    fake = FakeOpenAI(unique("up"), models=[unique("model")])
    async with serve_asgi(fake) as url:
        yield fake, url
