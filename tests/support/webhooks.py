"""A real HTTPS webhook receiver for the tests, its certificates, the receiver-side
signature check exactly as docs/projects-api.md tells integrators to write it, and
the rows and alerts the dispatcher tests start from.

``make_tls`` generates a throwaway certificate authority and a server certificate it
signs (for ``localhost``, ``127.0.0.1`` and a few test names) at fixture time, with
the ``cryptography`` package; Arona trusts the authority through
``ARONA_WEBHOOK_CA_FILE`` (or an ``ssl_context`` handed to ``build_webhooks``), as an
operator with a private PKI would.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import hmac
import ipaddress
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import msgspec
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sqlalchemy import event, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import Project, ProjectWebhook, User, WebhookDelivery
from app.domain.quotas.alerts import BudgetAlert
from app.domain.secrets.aad import webhook_secret_aad
from app.domain.webhooks import signing
from app.domain.webhooks.setup import Webhooks
from app.lib.clock import utcnow
from app.lib.vault import Vault, mask

TEST_NAMES = ("localhost", "hooks.test", "rebind.test")


@dataclass(frozen=True, slots=True)
class Tls:
    ca_file: Path
    cert_file: Path
    key_file: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def client_context(self) -> ssl.SSLContext:
        """Trusts the test authority (and nothing of the system's: not needed here)."""
        return ssl.create_default_context(cafile=str(self.ca_file))


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_tls(directory: Path) -> Tls:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("Arona test CA"))
        .issuer_name(_name("Arona test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in TEST_NAMES]
    names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    tls = Tls(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    tls.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    tls.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tls.key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return tls


@dataclass(frozen=True, slots=True)
class Received:
    path: str
    headers: dict[str, str]
    """Lower-case names."""
    body: bytes
    at: float
    """``time.monotonic()`` when it arrived."""

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


@dataclass(slots=True)
class WebhookReceiver:
    """An HTTPS server on a loopback port that records every request and answers from
    a script: the next status of ``script`` (a 3xx redirects to ``/landing``), then
    ``default``. ``/landing`` counts the requests that followed a redirect."""

    tls: Tls
    default: int = 200
    script: deque[int] = field(default_factory=deque)
    received: list[Received] = field(default_factory=list)
    landed: int = 0
    port: int = 0
    _runner: web.AppRunner | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    def answer(self, *statuses: int) -> None:
        self.script.extend(statuses)

    def url(self, host: str = "127.0.0.1", path: str = "/hook") -> str:
        return f"https://{host}:{self.port}{path}"

    async def _landing(self, request: web.Request) -> web.Response:
        self.landed += 1
        return web.Response(text="followed")

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.received.append(Received(request.path, headers, body, time.monotonic()))
        status = self.script.popleft() if self.script else self.default
        if 300 <= status < 400:
            raise web.HTTPFound(location=self.url(path="/landing"))
        return web.Response(status=status, text=f"receiver says {status}")

    async def start(self) -> None:
        """Serve from a thread and event loop of its own: Litestar's test client runs
        the app in another thread and blocks the test's loop while a request is in
        flight, and a test event is delivered inside that request."""
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=loop.run_forever, name="webhook-receiver", daemon=True
        )
        self._thread.start()
        self._loop = loop
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._serve(), loop))

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/landing", self._landing)
        app.router.add_route("*", "/{tail:.*}", self._hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls.server_context())
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        loop, runner = self._loop, self._runner
        if loop is None:
            return
        if runner is not None:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(runner.cleanup(), loop))
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        loop.close()

    async def wait_for(self, count: int, within: float = 10.0) -> list[Received]:
        deadline = time.monotonic() + within
        while len(self.received) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.received)} of {count} requests within {within}s")
            await asyncio.sleep(0.01)
        return self.received


def verify_signature(secret: str, header: str, body: bytes, tolerance: int = 300) -> bool:
    """The receiver's check, as docs/projects-api.md writes it (kept in step with it)."""
    fields = [part.split("=", 1) for part in header.split(",") if "=" in part]
    timestamps = [value for key, value in fields if key == "t"]
    signatures = [value for key, value in fields if key == "v1"]
    if len(timestamps) != 1 or not signatures or not timestamps[0].isdigit():
        return False
    if abs(time.time() - int(timestamps[0])) > tolerance:
        return False  # too old (a replay) or from a clock far off
    signed = timestamps[0].encode() + b"." + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(expected, candidate) for candidate in signatures)


# ------------------------------------------------------------------ rows and alerts


async def new_project(engine: AsyncEngine) -> UUID:
    tag = uuid.uuid4().hex[:10]
    user_id, project_id = uuid.uuid4(), uuid.uuid4()
    async with engine.begin() as conn:
        await conn.execute(
            insert(User).values(id=user_id, email=f"{tag}@example.com", password_hash="x")
        )
        await conn.execute(
            insert(Project).values(id=project_id, name=tag, slug=tag, owner_id=user_id)
        )
    return project_id


async def add_hook(
    engine: AsyncEngine,
    vault: Vault,
    project_id: UUID,
    url: str,
    *,
    events: tuple[str, ...] = ("budget.threshold",),
    enabled: bool = True,
) -> tuple[UUID, str]:
    """A webhook row as the API writes it; (its id, its secret)."""
    hook_id, secret = uuid.uuid4(), signing.new_secret()
    now = utcnow()
    async with engine.begin() as conn:
        await conn.execute(
            insert(ProjectWebhook).values(
                id=hook_id,
                project_id=project_id,
                url=url,
                description="",
                enabled=enabled,
                events=list(events),
                secret_encrypted=vault.encrypt(secret, webhook_secret_aad(project_id, hook_id)),
                secret_hint=mask(secret),
                created_at=now,
                updated_at=now,
            )
        )
    return hook_id, secret


def budget_alert(project_id: UUID, threshold: int = 80) -> BudgetAlert:
    now = utcnow()
    return BudgetAlert(
        alert_id=f"{project_id}:cost:day:{uuid.uuid4().hex[:8]}:{threshold}",
        project_id=project_id,
        credential_id=None,
        metric="cost",
        window="day",
        threshold=threshold,
        used=800_000,
        limit=1_000_000,
        currency="USD",
        resets_at=now + datetime.timedelta(hours=5),
        at=now,
    )


@contextlib.asynccontextmanager
async def running(*bundles: Webhooks) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(b.dispatcher.run()) for b in bundles]
    try:
        yield
    finally:
        for bundle, task in zip(bundles, tasks, strict=True):
            await bundle.dispatcher.stop()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await bundle.dispatcher.aclose()


async def rows_of(engine: AsyncEngine, hook_id: UUID | None = None) -> list[Any]:
    query = select(WebhookDelivery).order_by(WebhookDelivery.created_at)
    if hook_id is not None:
        query = query.where(WebhookDelivery.webhook_id == hook_id)
    async with engine.connect() as conn:
        return list((await conn.execute(query)).all())


async def settled(engine: AsyncEngine, count: int, within: float = 15.0) -> list[Any]:
    """The rows once ``count`` of them are delivered or failed."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        rows = await rows_of(engine)
        if sum(r.status != "pending" for r in rows) >= count:
            return rows
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError([(r.status, r.attempts, r.last_error) for r in rows])
        await asyncio.sleep(0.02)


@contextlib.contextmanager
def statements(engine: AsyncEngine) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(*args: Any) -> None:
        seen.append(str(args[2]))

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)
