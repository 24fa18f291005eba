"""PostgreSQL stopped and restarted under load: served from caches, nothing unmetered.

Two real ``arona serve`` replicas on a PostgreSQL server of this module's own (the
shared one is never touched), the shared Redis under a prefix of their own, and a
fake OpenAI-compatible upstream. A tenant is created and its caches warmed; then a
steady load of chat completions (streamed and not, the official ``openai`` SDK, each
with a conversation id of its own) runs while the database is stopped (``immediate``:
a crash as clients see it) for a few seconds and started again.

While it is down:

- the load keeps getting complete 200 answers on both replicas;
- ``/readyz`` says ``degraded`` with the database unreachable (503 plainly, 200 with
  ``allow_degraded=true``, the load balancer's view), and shows the usage records
  waiting for it;
- an admin write and a project write are 503 ``database_unavailable`` in the error
  shape, with ``Retry-After``;
- an API key no replica has seen is 503 ``database_unavailable``, not 401: the replica
  cannot tell a key created just before the outage from a wrong one, and a 401 would
  tell a legitimate client its key is invalid; with ``Retry-After`` it retries;
- a known tenant that never called before (nothing cached) gets a clear 503 for what
  needs the database (``quota_unavailable``, ``database_unavailable``), not a 500 or
  a hang.

After the restart the buffered usage reaches the database, and the tenant's
``usage_records`` are exactly its answered calls: one row per conversation id of a
200 answer, none missing, none twice. Run twice: with the usage write-ahead stream in
Redis (the default with Redis; entries wait there) and without it
(``ARONA_USAGE_WAL=false``; entries wait in each replica's memory, which ``/readyz``
shows as ``usage_buffered``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from tests.faults.pg_fixtures import DATABASE, pg, pg_running
from tests.support.cluster import (
    ADMIN,
    Cluster,
    Replica,
    Tenant,
    new_tenant,
    register_backend,
    replica_env,
    spawn_replica,
    stop_replica,
    unique,
    wait_healthy_everywhere,
    wait_ready,
)
from tests.support.pg_instance import PostgresInstance

pytestmark = pytest.mark.faults
__all__ = ["pg", "pg_running"]  # fixtures

REPLICAS = 2
WORKERS = 6
PAUSE_SECONDS = 0.05
"""Between two calls of one worker: a steady, modest load (tens of calls a second)."""
BEFORE_SECONDS = 2.0
OUTAGE_SECONDS = 6.0
AFTER_SECONDS = 2.0
READY_TIMEOUT_SECONDS = 60.0
DRAIN_TIMEOUT_SECONDS = 30.0
REPLICA_ENV = {
    # Bounded waits even if a connect hangs; the defaults (5 s, 10 s) would do too.
    "ARONA_DB_CONNECT_TIMEOUT_SECONDS": "2",
    "ARONA_DB_POOL_TIMEOUT_SECONDS": "5",
}


@dataclass(frozen=True, slots=True)
class Outcome:
    conversation_id: str
    streamed: bool
    started: float
    ended: float
    status: int
    """200 for a complete answer; the error status otherwise (0: no response)."""
    detail: str = ""


@contextlib.asynccontextmanager
async def replicas_on(
    pg: PostgresInstance, tmp_path: Path, extra_env: dict[str, str]
) -> AsyncIterator[Cluster]:
    database_url = pg.sqlalchemy_url(DATABASE)
    env = {
        **replica_env(database_url, f"test:faults:{uuid.uuid4().hex}:", tmp_path / "data"),
        **REPLICA_ENV,
        **extra_env,
    }
    started: list[Replica] = [
        spawn_replica(f"replica-{'ab'[i]}", env, tmp_path) for i in range(REPLICAS)
    ]
    cluster = Cluster(started, database_url, pg.dsn(DATABASE))
    try:
        await asyncio.gather(*(wait_ready(r) for r in started))
        async with contextlib.AsyncExitStack() as stack:
            for replica in started:
                client = httpx.AsyncClient(base_url=replica.url, timeout=30.0)
                cluster.http.append(await stack.enter_async_context(client))
            yield cluster
    except BaseException:
        print(cluster.logs())
        print(f"----- postgres -----\n{pg.log()}")
        raise
    finally:
        await asyncio.gather(*(asyncio.to_thread(stop_replica, r) for r in started))


def sdk(replica: Replica, api_key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{replica.url}/v1", api_key=api_key, max_retries=0, timeout=30.0
    )


async def call(client: openai.AsyncOpenAI, model: str, *, streamed: bool) -> Outcome:
    """One chat completion with a conversation id of its own (which its usage row
    carries, so rows and answers can be matched one to one)."""
    conversation = f"dbdown-{uuid.uuid4().hex}"
    messages: Any = [{"role": "user", "content": f"hello {conversation}"}]
    extra = {"conversation_id": conversation}
    started = time.monotonic()
    status, detail = 200, ""
    try:
        if streamed:
            text = ""
            stream = await client.chat.completions.create(
                model=model, messages=messages, stream=True, extra_body=extra
            )
            async with stream:
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        text += chunk.choices[0].delta.content
        else:
            completion = await client.chat.completions.create(
                model=model, messages=messages, extra_body=extra
            )
            text = completion.choices[0].message.content or ""
        if not text:
            status, detail = -1, "empty answer"
    except openai.APIStatusError as exc:
        status, detail = exc.status_code, str(exc.body)
    except openai.APIError as exc:
        status, detail = 0, repr(exc)
    return Outcome(conversation, streamed, started, time.monotonic(), status, detail)


async def embed(client: openai.AsyncOpenAI, model: str) -> Outcome:
    conversation = f"dbdown-embed-{uuid.uuid4().hex}"
    started = time.monotonic()
    response = await client.embeddings.create(
        model=model, input="to embed", extra_body={"conversation_id": conversation}
    )
    status = 200 if response.data and response.data[0].embedding else -1
    return Outcome(conversation, False, started, time.monotonic(), status)


async def error_of(client: openai.AsyncOpenAI, model: str) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as raised:
        await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}]
        )
    return raised.value


async def drained_rows(cluster: Cluster, tenant: Tenant, expected: int) -> list[Any]:
    """The tenant's usage rows once ``expected`` are there and nothing is buffered in
    memory any more (or what is there at the deadline, for the assertions to report)."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_SECONDS
    while True:
        rows = await cluster.fetch(
            "SELECT conversation_id, status FROM usage_records WHERE api_key_id = $1",
            uuid.UUID(tenant.api_key_id),
        )
        states = [(await c.get("/readyz")).json() for c in cluster.http]
        settled = all(s["status"] == "ready" and s["checks"]["usage_buffered"] == 0 for s in states)
        if (settled and len(rows) >= expected) or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.2)


def assert_unavailable(
    error: openai.APIStatusError | httpx.Response, code: str = "database_unavailable"
) -> None:
    """A 503 in the error shape with ``Retry-After``."""
    response = error if isinstance(error, httpx.Response) else error.response
    assert response.status_code == 503, response.text
    body = response.json()
    assert set(body["error"]) >= {"message", "type", "code", "param"}, body
    assert body["error"]["code"] == code, body
    assert body["error"]["type"] == "api_error", body
    assert int(response.headers["retry-after"]) >= 1


@pytest.mark.parametrize("usage_path", ["wal", "memory"])
async def test_the_load_is_served_and_metered_through_a_database_restart(
    pg_running: PostgresInstance, tmp_path: Path, usage_path: str
) -> None:
    pg = pg_running
    fake = FakeOpenAI(unique("up"), models=[unique("model")])
    model = fake.control.models[0]
    extra_env = {"ARONA_USAGE_WAL": "false"} if usage_path == "memory" else {}
    async with (
        serve_asgi(fake) as upstream_url,
        replicas_on(pg, tmp_path, extra_env) as cluster,
    ):
        a = cluster.a
        backend = unique("backend")
        await register_backend(a, backend, upstream_url)
        await wait_healthy_everywhere(cluster, backend)
        tenant: Tenant = await new_tenant(a)
        # A quota, so every call takes the limits cache and the atomic admission.
        quota = await a.put(
            f"/api/admin/projects/{tenant.project_id}/quota",
            json={"perMinute": None, "perDay": 1_000_000, "perMonth": None},
            headers=ADMIN,
        )
        assert quota.status_code == 200, quota.text
        # Known to every replica (its key is in their indexes) but never calls before
        # the outage: nothing of it is cached.
        cold: Tenant = await new_tenant(a)

        clients = [sdk(r, tenant.api_key) for r in cluster.replicas]
        outcomes: list[Outcome] = []
        # Warm each replica: limits, override index (conversation ids), model list.
        for client in clients:
            for streamed in (False, True):
                outcomes.append(await call(client, model, streamed=streamed))
            assert model in [m.id for m in (await client.models.list()).data]
        assert all(o.status == 200 for o in outcomes), outcomes

        stop = asyncio.Event()

        async def worker(index: int) -> None:
            turn = index
            while not stop.is_set():
                client = clients[turn % REPLICAS]
                outcomes.append(await call(client, model, streamed=turn % 2 == 0))
                turn += 1
                await asyncio.sleep(PAUSE_SECONDS)

        workers = [asyncio.create_task(worker(i)) for i in range(WORKERS)]
        try:
            await asyncio.sleep(BEFORE_SECONDS)
            down_at = time.monotonic()
            await asyncio.to_thread(pg.stop, "immediate")
            stopped_at = time.monotonic()

            for http in cluster.http:
                assert (await http.get("/readyz")).status_code == 503
                ready = await http.get("/readyz", params={"allow_degraded": "true"})
                assert ready.status_code == 200, ready.text
                assert ready.json()["status"] == "degraded", ready.text
                assert ready.json()["checks"]["database"].startswith("unreachable"), ready.text
            assert_unavailable(
                await a.post(
                    "/api/admin/backends",
                    json={"name": unique("b"), "type": "external", "url": upstream_url},
                    headers=ADMIN,
                )
            )
            assert_unavailable(
                await cluster.b.post(
                    "/api/projects",
                    json={"name": "During", "slug": unique("p")},
                    headers=tenant.user_headers,
                )
            )
            never_seen = f"ak-{uuid.uuid4().hex}{uuid.uuid4().hex}"
            for replica in cluster.replicas:
                for _ in range(2):
                    assert_unavailable(await error_of(sdk(replica, never_seen), model))
            # The warm tenant's model list and embeddings are served; the cold tenant's
            # calls are a clear 503 (its quota limits and model list were never read).
            assert model in [m.id for m in (await clients[1].models.list()).data]
            outcomes.append(await embed(clients[0], model))
            assert outcomes[-1].status == 200, outcomes[-1]
            cold_client = sdk(cluster.replicas[0], cold.api_key)
            assert_unavailable(await error_of(cold_client, model), "quota_unavailable")
            with pytest.raises(openai.APIStatusError) as listing:
                await cold_client.models.list()
            assert_unavailable(listing.value)

            buffered = 0
            while time.monotonic() - down_at < OUTAGE_SECONDS:
                for http in cluster.http:
                    checks = (await http.get("/readyz")).json()["checks"]
                    buffered = max(buffered, checks["usage_buffered"])
                await asyncio.sleep(0.2)
            await asyncio.to_thread(pg.start)
            up_at = time.monotonic()
            await asyncio.sleep(AFTER_SECONDS)
        finally:
            stop.set()
            await asyncio.gather(*workers)

        # The writers retry on their own interval (the in-memory buffer, or the
        # write-ahead stream where Redis holds the entries): wait for the rows.
        rows = await drained_rows(cluster, tenant, expected=len(outcomes))
        during = [o for o in outcomes if o.started >= stopped_at and o.ended <= up_at]
        failed = [o for o in outcomes if o.status != 200]
        per_conversation = Counter(r["conversation_id"] for r in rows)
        print(
            f"[{usage_path}] calls {len(outcomes)} (streamed {sum(o.streamed for o in outcomes)}), "
            f"served while PostgreSQL was down {len(during)} "
            f"(outage {up_at - down_at:.1f}s), failed {len(failed)}, "
            f"usage buffered in memory at most {buffered}, usage rows {len(rows)}"
        )
        assert not failed, failed[:5]
        assert len(during) > 0
        if usage_path == "memory":
            # Held in memory while the database was down, as /readyz reported.
            assert buffered > 0
        assert all(r["status"] == 200 for r in rows)
        duplicated = {c: n for c, n in per_conversation.items() if n > 1}
        assert not duplicated, duplicated
        answered = {o.conversation_id for o in outcomes}
        missing = answered - set(per_conversation)
        unexpected = set(per_conversation) - answered
        assert not missing, f"{len(missing)} answered calls have no usage row"
        assert not unexpected, f"{len(unexpected)} usage rows match no answered call"
        assert len(rows) == len(outcomes)

        # The database is back for writes too.
        created = await a.post(
            "/api/projects",
            json={"name": "After", "slug": unique("p")},
            headers=tenant.user_headers,
        )
        assert created.status_code == 201, created.text
        # And the cold tenant is served now.
        cold_answer = await call(sdk(cluster.replicas[1], cold.api_key), model, streamed=True)
        assert cold_answer.status == 200, cold_answer
