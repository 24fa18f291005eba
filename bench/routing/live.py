"""The live half of the routing benchmark: simulated engines behind real HTTP, Arona in
front of them as in production, and an open-loop client.

- **Engines.** Every engine of every pool is a ``BatchingEngineServer`` on a loopback
  port of this process, registered once in Arona as a ``vllm`` backend (so Arona reads
  its ``/metrics``) advertising its pool's model, ``rb-<pool>``. Each run gets fresh
  engines (empty queues, zeroed counters) behind the same ports. Engine time runs
  ``time_scale`` times faster than wall time; every figure is in engine seconds.
- **Pacing.** An asyncio timer wakes late by a fraction of a millisecond, which at a
  scaled step of a few milliseconds would make every engine several percent slower
  than its shape says (so 95 % load would be over 100 %). ``PacedServer`` wins the
  lateness back on the next steps: over a run each engine's busy time is what its
  shape plans. The report prints the residual (``pace``).
- **Which request is which.** The client puts ``q<arrival number>z`` as the first
  word of each prompt; the engine's port reads it and labels the engine's own request
  record with it, so queue wait and time to first token come from the engine, per
  arrival, whatever path the request took.
- **Arona.** ``arona serve`` on a throwaway PostgreSQL database and Redis, 1 or 3
  processes sharing both, restarted per routing score (``ARONA_ROUTING_SCORE``), its
  metrics intervals and cooldown divided by ``time_scale`` so its cadence is the same
  in engine time. Everything is configured through the public API.
- **Client.** Open loop: each arrival is sent at its time (scaled) whatever the others
  are doing, streamed, and abandoned (connection closed, so the engine aborts it) if
  no content has come ``FIRST_TOKEN_DEADLINE`` engine seconds after its arrival. A
  run ends once every arrival has its first token or was abandoned; what is still
  streaming then is cut.
- **No gateway.** The same client can also pick the engine itself with one of the
  simulation's policies reading the engines in this process (the fresh-metrics
  oracle, live): the harness's own deviation from the simulation, for calibration.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import re
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import msgspec

from app.fakes.asgi_io import Receive, Scope, Send, read_body
from app.fakes.batching_engine import BatchingEngine, EngineRequest, EngineShape
from app.fakes.batching_server import BatchingEngineServer
from app.fakes.serve import serve_asgi
from app.lib.ports import free_port
from bench.arona_sut import AronaDeployment, _arona_executable
from bench.procs import SUT_CPU, BenchError, Child, Supervisor, run_checked, tail, wait_http
from bench.procstat import cpu_seconds
from bench.routing.simulate import Policy
from bench.routing.workload import FIRST_TOKEN_DEADLINE, POOLS, Arrival, Workload

ScoreKind = Literal["seed", "capacity"]
Surface = Literal["v1", "runtime"]

CHUNK_TOKENS = 8
"""Tokens per SSE frame from the engines (the first token goes alone)."""
BUSY_SECONDS = 0.25
FRESH_SECONDS = 2.0
EXPIRE_SECONDS = 10.0
COOLDOWN_SECONDS = 30.0
"""Arona's defaults, divided by ``time_scale`` for the run."""
HEALTH_TIMEOUT_SECONDS = 60.0
SETTLE_TIMEOUT_SECONDS = 20.0
"""After a run, how long the engines may take to see every cut request go."""
MAX_CONNECTIONS = 4000
CLIENT_POOLS = 32
WARM_CONNECTIONS = 160
"""Connections opened to Arona before a run (split over its replicas): about the most
requests in flight at 95 % load."""
WARM_PER_ENGINE = 48
TAG = contextvars.ContextVar[int | None]("routing_bench_tag", default=None)
TAG_PATTERN = re.compile(rb'"content":\s*"q(\d+)z')


def model_of(pool: str) -> str:
    return f"rb-{pool}"


def backend_of(pool: str, engine: str) -> str:
    return f"rb-{pool}-{engine}"


def prompt_text(index: int, tokens: int) -> str:
    """``tokens`` words, the first naming the arrival."""
    return f"q{index}z" + " w" * max(0, tokens - 1)


# -- engines -------------------------------------------------------------------------


class TaggedEngine(BatchingEngine):
    """A ``BatchingEngine`` that files each request under the client's arrival number."""

    def __init__(self, shape: EngineShape) -> None:
        super().__init__(shape)
        self.by_tag: dict[int, EngineRequest] = {}

    def submit(
        self,
        prompt_tokens: int,
        output_tokens: int,
        now: float,
        sink: Any = None,
    ) -> EngineRequest:
        request = super().submit(prompt_tokens, output_tokens, now, sink)
        tag = TAG.get()
        if tag is not None:
            self.by_tag[tag] = request
        return request


class PacedServer(BatchingEngineServer):
    """A ``BatchingEngineServer`` whose steps, on average, last what they plan: a step
    that ended late shortens the next ones by as much."""

    def __init__(self, engine: TaggedEngine, model: str, *, time_scale: float) -> None:
        super().__init__(engine, model, time_scale=time_scale, chunk_tokens=CHUNK_TOKENS)
        self.tagged = engine
        self.planned = 0.0
        """Engine seconds of steps as planned by the shape."""
        self.taken = 0.0
        """Engine seconds the steps really took."""

    async def _drive(self) -> None:
        engine = self.engine
        behind = 0.0
        while True:
            started = self.clock()
            seconds = engine.start_step(started)
            if seconds is None:
                behind = 0.0
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(max(0.0, seconds - behind) / self.time_scale)
            now = self.clock()
            behind = max(0.0, behind + (now - started) - seconds)
            self.planned += seconds
            self.taken += now - started
            engine.finish_step(now)


class EnginePort:
    """One engine's loopback port: forwards to the current run's server and labels
    the requests it passes with the arrival number found in the prompt."""

    def __init__(self, pool: str, shape: EngineShape, time_scale: float) -> None:
        self.pool = pool
        self.shape = shape
        self.time_scale = time_scale
        self.url = ""
        self.server = self._fresh()

    def _fresh(self) -> PacedServer:
        engine = TaggedEngine(self.shape)
        return PacedServer(engine, model_of(self.pool), time_scale=self.time_scale)

    async def renew(self) -> PacedServer:
        """A fresh engine for the next run; the old one stops stepping."""
        old, self.server = self.server, self._fresh()
        await old.stop()
        return self.server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        server = self.server
        if not scope["path"].endswith("/chat/completions"):
            await server(scope, receive, send)
            return
        raw = await read_body(receive)
        match = TAG_PATTERN.search(raw)
        TAG.set(int(match.group(1)) if match else None)
        await server(scope, _replay(raw, receive), send)


def _replay(raw: bytes, receive: Receive) -> Receive:
    """The body already read, then the client's own messages (its disconnect)."""
    given = False

    async def replay() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return dict(await receive())

    return replay


@dataclass(slots=True)
class EngineHost:
    """Every pool's engines on their ports, in this process's event loop."""

    time_scale: float
    ports: dict[str, list[EnginePort]] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def serving(self, pools: Sequence[str]) -> AsyncIterator[EngineHost]:
        async with contextlib.AsyncExitStack() as stack:
            for pool in pools:
                ports = [EnginePort(pool, shape, self.time_scale) for shape in POOLS[pool]]
                for port in ports:
                    port.url = await stack.enter_async_context(serve_asgi(port))
                self.ports[pool] = ports
            try:
                yield self
            finally:
                for ports in self.ports.values():
                    for port in ports:
                        await port.server.stop()

    async def begin(self, pool: str) -> list[PacedServer]:
        servers = [await port.renew() for port in self.ports[pool]]
        for server in servers:
            server.start()  # one clock origin for the pool, before the first arrival
        return servers

    def backends(self) -> list[tuple[str, str, str]]:
        """(backend name, URL, model) for every engine."""
        return [
            (backend_of(pool, port.shape.name), port.url, model_of(pool))
            for pool, ports in self.ports.items()
            for port in ports
        ]


# -- Arona ---------------------------------------------------------------------------


@dataclass(slots=True)
class Credentials:
    admin: dict[str, str]
    api_key: str
    runtime_token: str


@dataclass(slots=True)
class AronaCluster:
    """``arona serve`` processes on one database and Redis, restarted per setting."""

    supervisor: Supervisor
    deployment: AronaDeployment
    run_dir: Path
    time_scale: float
    base_env: dict[str, str] = field(default_factory=dict)
    children: list[Child] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    credentials: Credentials | None = None
    setting: tuple[ScoreKind, int] | None = None
    generation: int = 0

    async def prepare(self, host: EngineHost) -> None:
        """Database, migrations, one replica, then everything set up through the API."""
        self.base_env = self.deployment.environment(0)
        await asyncio.to_thread(self.deployment.create_database)
        await asyncio.to_thread(run_checked, [_arona_executable(), "migrate"], env=self.base_env)
        await self.start("capacity", 1)
        admin = {"Authorization": f"Bearer {self.base_env['ARONA_ADMIN_TOKEN']}"}
        async with _client(self.urls[0]) as client:
            for name, url, model in host.backends():
                await _api(
                    client,
                    "POST",
                    "/api/admin/backends",
                    headers=admin,
                    json={"name": name, "type": "vllm", "url": url, "models": [model]},
                )
            for pool in host.ports:
                await _api(
                    client,
                    "POST",
                    "/api/admin/model-profiles",
                    headers=admin,
                    json={
                        "id": model_of(pool),
                        "name": model_of(pool),
                        "baseModel": model_of(pool),
                        "contextWindowTokens": 8192,
                        "maxOutputTokens": 1024,
                    },
                )
            api_key, runtime_token = await _project_credentials(client)
        self.credentials = Credentials(admin, api_key, runtime_token)
        await self.wait_healthy([name for name, _, _ in host.backends()])

    def environment(self, port: int, score: ScoreKind) -> dict[str, str]:
        scale = self.time_scale
        env = dict(self.base_env)
        env.update(
            ARONA_PORT=str(port),
            # A prefix per start: no replica reads load totals a stopped one left behind.
            ARONA_REDIS_PREFIX=f"{self.deployment.redis_prefix}g{self.generation}:",
            ARONA_ROUTING_SCORE=score,
            ARONA_VLLM_METRICS_BUSY_SECONDS=f"{BUSY_SECONDS / scale:.6f}",
            ARONA_VLLM_METRICS_FRESH_SECONDS=f"{FRESH_SECONDS / scale:.6f}",
            ARONA_VLLM_METRICS_EXPIRE_SECONDS=f"{EXPIRE_SECONDS / scale:.6f}",
            ARONA_BACKEND_COOLDOWN_SECONDS=f"{COOLDOWN_SECONDS / scale:.6f}",
        )
        return env

    async def start(self, score: ScoreKind, replicas: int) -> None:
        if self.setting == (score, replicas):
            return
        self.stop()
        self.generation += 1
        for number in range(replicas):
            port = free_port()
            child = self.supervisor.start(
                f"arona-{number}",
                [_arona_executable(), "serve"],
                cpu=SUT_CPU,
                log=self.run_dir / f"arona-g{self.generation}-{number}.log",
                env=self.environment(port, score),
            )
            self.children.append(child)
            self.urls.append(f"http://127.0.0.1:{port}")
        for child, url in zip(self.children, self.urls, strict=True):
            await asyncio.to_thread(wait_http, f"{url}/healthz", child, timeout=60)
        self.setting = (score, replicas)

    async def wait_healthy(self, names: list[str]) -> None:
        """Every replica sees every named backend healthy."""
        assert self.credentials is not None
        deadline = time.monotonic() + HEALTH_TIMEOUT_SECONDS
        for url in self.urls:
            async with _client(url) as client:
                while True:
                    page = await _api(
                        client,
                        "GET",
                        "/api/admin/backends?limit=100",
                        headers=self.credentials.admin,
                    )
                    status = {b["name"]: b["health"]["status"] for b in page["items"]}
                    sick = [n for n in names if status.get(n) != "healthy"]
                    if not sick:
                        break
                    if time.monotonic() > deadline:
                        raise BenchError(f"backends not healthy on {url}: {sick}")
                    await asyncio.sleep(0.2)

    def stop(self) -> None:
        for child in self.children:
            self.supervisor.stop(child)
        self.children.clear()
        self.urls.clear()
        self.setting = None

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(child.pid) for child in self.children)

    def check_alive(self) -> None:
        for child in self.children:
            child.check_alive()

    def log_tail(self) -> str:
        return "\n".join(tail(child.log, 5) for child in self.children)


@contextlib.asynccontextmanager
async def _client(base_url: str, **kwargs: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=base_url, timeout=30.0, trust_env=False, **kwargs
    ) as client:
        yield client


async def _api(client: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> Any:
    try:
        response = await client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise BenchError(f"Arona {method} {path} failed: {exc!r}") from exc
    if not response.is_success:
        raise BenchError(f"Arona {method} {path} -> {response.status_code}: {response.text}")
    return response.json() if response.content else None


async def _project_credentials(client: httpx.AsyncClient) -> tuple[str, str]:
    """A user, a project, its API key (for /v1) and a runtime token (runtime API)."""
    email = f"routing-{secrets.token_hex(4)}@bench.arona.local"
    password = secrets.token_urlsafe(16)
    body = {"email": email, "password": password}
    await _api(client, "POST", "/api/auth/register", json=body)
    login = await _api(client, "POST", "/api/auth/login", json=body)
    user = {"Authorization": f"Bearer {login['accessToken']}"}
    project = await _api(
        client, "POST", "/api/projects", headers=user, json={"name": "Routing", "slug": "routing"}
    )
    base = f"/api/projects/{project['id']}"
    key = await _api(client, "POST", f"{base}/api-keys", headers=user, json={"name": "bench"})
    token = await _api(
        client, "POST", f"{base}/runtime-tokens", headers=user, json={"name": "bench"}
    )
    return str(key["key"]), str(token["token"])


# -- the client ------------------------------------------------------------------------


@dataclass(slots=True)
class Seen:
    """What the client saw of one arrival."""

    index: int
    replica: int = 0
    status: int | None = None
    sent_at: float = 0.0
    """When it was due to be sent (event-loop time)."""
    first_byte: float | None = None
    """Wall seconds from the arrival's send time to its first content."""
    timed_out: bool = False
    error: str = ""
    engine: int | None = None
    """Chosen by the client itself (runs without a gateway)."""


@dataclass(slots=True)
class Target:
    """Where the arrivals go: Arona (a surface, its replicas) or straight to the engines
    with a policy of the simulation choosing."""

    label: str
    surface: Surface | None = None
    urls: list[str] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    conversations: list[str] = field(default_factory=list)
    policy: Policy | None = None


@dataclass(slots=True)
class LiveRecord:
    """One arrival, from the engine's own record of it (None: it reached no engine)."""

    index: int
    engine: int | None
    request: EngineRequest | None
    seen: Seen


@dataclass(slots=True)
class LiveRun:
    label: str
    engines: list[str]
    records: list[LiveRecord]
    scrapes: list[int]
    engine_seconds: float
    wall_seconds: float
    gateway_cpu_seconds: float | None
    pace: float
    """Busy engine time taken / planned, the worst engine (1.000: faithful)."""
    step_wall_ms: float
    """A full-batch step of the pool's fastest engine, in wall milliseconds."""
    time_scale: float = 1.0
    origins: list[float] = field(default_factory=list)
    """Event-loop time at each engine's clock zero (to place engine times on the
    client's clock)."""
    harness_cpu_percent: float = 0.0
    """CPU of this process (engines and client) over the run, % of one core."""
    unsettled: int = 0
    """Requests still on an engine after the settle timeout (cut streams not aborted)."""


def _has_content(line: str) -> bool:
    if not line.startswith("data:"):
        return False
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return False
    try:
        event = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return False
    if not isinstance(event, dict):
        return False
    for choice in event.get("choices") or ():
        if isinstance(choice, dict) and ((choice.get("delta") or {}).get("content")):
            return True
    return False


class OpenLoopClient:
    """httpx clients taking the requests in turn: httpx's connection pool does work
    proportional to its connections on every request, so one pool with ~100 streams
    open delays requests by tens of milliseconds; many small pools do not."""

    def __init__(self, time_scale: float) -> None:
        self.time_scale = time_scale
        self.pools = [
            httpx.AsyncClient(
                timeout=httpx.Timeout(None, connect=10.0),
                limits=httpx.Limits(
                    max_connections=MAX_CONNECTIONS // CLIENT_POOLS,
                    max_keepalive_connections=MAX_CONNECTIONS // CLIENT_POOLS,
                    keepalive_expiry=60.0,
                ),
                trust_env=False,
            )
            for _ in range(CLIENT_POOLS)
        ]

    async def close(self) -> None:
        for pool in self.pools:
            await pool.aclose()

    async def warm(self, urls: list[str], per_url: int) -> None:
        """Open connections before the run, so few requests wait for one to be made."""
        gate = asyncio.Event()

        async def one(number: int, url: str) -> None:
            await gate.wait()
            with contextlib.suppress(httpx.HTTPError):
                await self.pools[number % CLIENT_POOLS].get(url)

        tasks = [asyncio.create_task(one(number, url)) for url in urls for number in range(per_url)]
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(*tasks)

    async def run(
        self,
        workload: Workload,
        target: Target,
        servers: list[PacedServer],
    ) -> list[Seen]:
        arrivals = workload.arrivals()
        loop = asyncio.get_running_loop()
        seen = [Seen(i) for i in range(len(arrivals))]
        left = len(arrivals)
        all_resolved = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []

        def resolved() -> None:
            nonlocal left
            left -= 1
            if left == 0:
                all_resolved.set()

        t0 = loop.time()
        for index, arrival in enumerate(arrivals):
            delay = t0 + arrival.at / self.time_scale - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = loop.create_task(
                self._one(index, arrival, t0, target, servers, seen[index], resolved)
            )
            tasks.append(task)
        if arrivals:
            await all_resolved.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return seen

    async def _one(
        self,
        index: int,
        arrival: Arrival,
        t0: float,
        target: Target,
        servers: list[PacedServer],
        seen: Seen,
        resolved: Any,
    ) -> None:
        loop = asyncio.get_running_loop()
        sent_at = t0 + arrival.at / self.time_scale
        seen.sent_at = sent_at
        deadline = t0 + (arrival.at + FIRST_TOKEN_DEADLINE) / self.time_scale
        url, body, headers = self._request(index, arrival, target, servers, seen)
        first = False
        try:
            async with asyncio.timeout_at(deadline) as timer:
                http = self.pools[index % CLIENT_POOLS]
                async with http.stream("POST", url, json=body, headers=headers) as response:
                    seen.status = response.status_code
                    if response.status_code != 200:
                        seen.error = f"status {response.status_code}"
                        return
                    lines = response.aiter_lines()
                    async for line in lines:
                        if line.startswith("event: error"):
                            seen.error = "error event"
                            return
                        if not first and _has_content(line):
                            first = True
                            seen.first_byte = loop.time() - sent_at
                            timer.reschedule(None)
                            resolved()
        except TimeoutError:
            seen.timed_out = not first
        except httpx.HTTPError as exc:
            seen.error = type(exc).__name__
        finally:
            if target.policy is not None and seen.engine is not None:
                target.policy.done(0.0, seen.engine, 0, _NO_REQUEST)
            if not first:
                resolved()

    def _request(
        self,
        index: int,
        arrival: Arrival,
        target: Target,
        servers: list[PacedServer],
        seen: Seen,
    ) -> tuple[str, dict[str, Any], dict[str, str]]:
        messages = [{"role": "user", "content": prompt_text(index, arrival.prompt_tokens)}]
        if target.policy is not None:
            engines: list[BatchingEngine] = [s.engine for s in servers]
            now = servers[0].clock()
            chosen = target.policy.choose(now, engines, 0)
            target.policy.sent(now, chosen, 0, _NO_REQUEST)
            seen.engine = chosen
            url = f"{target.urls[chosen]}/v1/chat/completions"
            model = servers[chosen].model
            body = {"model": model, "messages": messages, "max_tokens": arrival.output_tokens}
            return url, {**body, "stream": True}, {}
        replica = index % len(target.urls)
        seen.replica = replica
        base = target.urls[replica]
        if target.surface == "runtime":
            body = {
                "conversationId": target.conversations[index],
                "messages": messages,
                "maxTokens": arrival.output_tokens,
                "stream": True,
            }
            return f"{base}/api/runtime/chat", body, target.headers
        body = {
            "model": servers[0].model,
            "messages": messages,
            "max_tokens": arrival.output_tokens,
            "stream": True,
        }
        return f"{base}/v1/chat/completions", body, target.headers


_NO_REQUEST = EngineRequest(0, 1, 1, 0.0)
"""Policies of the simulation get the engine's request object in ``sent``/``done``;
none of them reads it, and the client does not have it."""


# -- one run ---------------------------------------------------------------------------


async def create_conversations(
    cluster: AronaCluster, pool: str, count: int, parallel: int = 8
) -> list[str]:
    """One new conversation per arrival (no affinity between arrivals)."""
    assert cluster.credentials is not None
    headers = {"Authorization": f"Bearer {cluster.credentials.runtime_token}"}
    out: list[str] = [""] * count
    queue = list(range(count))

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            index = queue.pop()
            created = await _api(
                client,
                "POST",
                "/api/runtime/conversations",
                headers=headers,
                json={"modelProfileId": model_of(pool)},
            )
            out[index] = str(created["id"])

    async with _client(cluster.urls[0]) as client:
        await asyncio.gather(*(worker(client) for _ in range(parallel)))
    return out


async def run_live(
    host: EngineHost,
    client: OpenLoopClient,
    workload: Workload,
    target: Target,
    cluster: AronaCluster | None,
) -> LiveRun:
    pool = workload.pool_name
    if cluster is not None:
        cluster.check_alive()
    if target.policy is not None:
        target.urls = [port.url for port in host.ports[pool]]
        await client.warm([f"{url}/v1/models" for url in target.urls], WARM_PER_ENGINE)
    else:
        per_replica = max(1, WARM_CONNECTIONS // len(target.urls))
        await client.warm([f"{url}/healthz" for url in target.urls], per_replica)
    servers = await host.begin(pool)
    cpu_before = cluster.cpu_seconds() if cluster is not None else None
    wall_started = time.monotonic()
    harness_before = time.process_time()
    seen = await client.run(workload, target, servers)
    wall = time.monotonic() - wall_started
    harness = 100 * (time.process_time() - harness_before) / wall if wall else 0.0
    engine_seconds = servers[0].clock()
    now = asyncio.get_running_loop().time()
    origins = [now - s.clock() / host.time_scale for s in servers]
    scrapes = [s.scrapes for s in servers]
    unsettled = await _settle(servers)
    cpu = (
        cluster.cpu_seconds() - cpu_before
        if cluster is not None and cpu_before is not None
        else None
    )
    if cluster is not None:
        cluster.check_alive()
    records: list[LiveRecord] = []
    for index, item in enumerate(seen):
        engine: int | None = None
        request: EngineRequest | None = None
        for number, server in enumerate(servers):
            found = server.tagged.by_tag.get(index)
            if found is not None:
                engine, request = number, found
                break
        records.append(LiveRecord(index, engine, request, item))
    pace = max((s.taken / s.planned if s.planned else 1.0) for s in servers)
    fastest = min(s.engine.shape.step_seconds(s.engine.shape.slots, 0) for s in servers)
    return LiveRun(
        label=target.label,
        engines=[s.engine.name for s in servers],
        records=records,
        scrapes=scrapes,
        engine_seconds=engine_seconds,
        wall_seconds=wall,
        gateway_cpu_seconds=cpu,
        pace=pace,
        step_wall_ms=1000 * fastest / host.time_scale,
        time_scale=host.time_scale,
        origins=origins,
        harness_cpu_percent=harness,
        unsettled=unsettled,
    )


async def _settle(servers: list[PacedServer]) -> int:
    """Wait for the cut streams to leave the engines (the gateway aborting them)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if all(s.engine.idle for s in servers):
            return 0
        await asyncio.sleep(0.05)
    return sum(s.engine.num_running + s.engine.num_waiting for s in servers)
