"""The SSRF guard (``app.lib.ssrf``) and the guarded upstream pool (``app.lib.http``).

Write-time checks are driven directly; connection-time checks go through a real
aiohttp session to real servers on loopback ports (a fake OpenAI upstream, a
redirector), so what is proven is what the gateway's calls will meet.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Iterable, Mapping
from ipaddress import ip_address

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver

from app.fakes.asgi_io import Receive, Scope, Send
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import serve_asgi
from app.lib.http import GuardedUpstreamHttp, build_guarded_http_client
from app.lib.settings import load_settings
from app.lib.ssrf import (
    METADATA,
    IPAddress,
    Resolve,
    SsrfPolicy,
    SsrfRefusedError,
    UnsafeUrlError,
    UrlGuard,
    classify,
    guarded_socket_factory,
    refusal_of,
)
from tests.support.dns import TableResolver

STRICT = SsrfPolicy()
PUBLIC = "93.184.215.14"

REFUSED = [
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("10.0.0.1", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("169.254.1.1", "link-local"),
    ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("240.0.0.1", "private"),  # reserved 240/4 counts as private in ipaddress
    ("255.255.255.255", "private"),
    ("100.64.0.1", "not globally routable"),  # carrier-grade NAT
    ("192.0.2.10", "private"),  # documentation
    ("169.254.169.254", METADATA),
    ("169.254.170.2", METADATA),
    ("100.100.100.200", METADATA),
    ("168.63.129.16", METADATA),  # Azure: a public-range address
    ("::1", "loopback"),
    ("::", "unspecified"),
    ("fe80::1", "link-local"),
    ("fe80::1%1", "link-local"),
    ("fc00::1", "private"),
    ("ff02::1", "multicast"),
    ("fd00:ec2::254", METADATA),
    ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
    ("::ffff:10.0.0.1", "private"),
    ("::ffff:169.254.169.254", METADATA),
    ("::127.0.0.1", "reserved"),  # IPv4-compatible (deprecated)
    ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
    ("64:ff9b::a00:1", "private"),  # NAT64 of 10.0.0.1
]
ALLOWED = [PUBLIC, "8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize(("address", "kind"), REFUSED)
def test_non_public_addresses_are_classified(address: str, kind: str) -> None:
    assert classify(ip_address(address)) == kind
    assert STRICT.refusal(ip_address(address)) is not None


@pytest.mark.parametrize("address", ALLOWED)
def test_public_addresses_pass(address: str) -> None:
    assert classify(ip_address(address)) is None
    assert STRICT.refusal(ip_address(address), 443) is None


def test_allow_private_lifts_everything_but_metadata() -> None:
    policy = SsrfPolicy(allow_private=True)
    for address, kind in REFUSED:
        refusal = policy.refusal(ip_address(address), 80)
        if kind == METADATA:
            assert refusal is not None
            assert "metadata" in refusal
        else:
            assert refusal is None, address


def test_an_exemption_is_one_socket_address() -> None:
    policy = SsrfPolicy(exempt=frozenset({("127.0.0.1", 8080)}))
    assert policy.refusal(ip_address("127.0.0.1"), 8080) is None
    assert policy.refusal(ip_address("127.0.0.1"), 8081) is not None
    assert policy.refusal(ip_address("127.0.0.2"), 8080) is not None
    metadata = SsrfPolicy(exempt=frozenset({("169.254.169.254", 80)}))
    assert metadata.refusal(ip_address("169.254.169.254"), 80) is not None


def test_the_setting_defaults_to_refusing_and_parses() -> None:
    assert load_settings({}).custom_llm_allow_private is False
    env = {"ARONA_CUSTOM_LLM_ALLOW_PRIVATE": "true"}
    assert load_settings(env).custom_llm_allow_private is True


# --------------------------------------------------------------------- write time


def resolver_of(table: Mapping[str, Iterable[str]]) -> Resolve:
    async def resolve(host: str, port: int) -> list[IPAddress]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [ip_address(a) for a in table[host]]

    return resolve


async def refused_code(guard: UrlGuard, url: str) -> str:
    with pytest.raises(UnsafeUrlError) as caught:
        await guard.check(url)
    return caught.value.code


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/v1",
        "example.com/v1",
        "http://user:pw@example.com/v1",
        "http://example.com/v1?x=1",
        "http://example.com/v1#frag",
        "http:///v1",
        "http://exa mple.com/v1",
        "http://example.com/v1\n",
        "http://exämple.com/v1",
        "http://example.com:99999/v1",
        "http://127.1/v1",
        "http://2130706433/v1",
        "http://0x7f000001/v1",
        "http://017700000001/v1",
    ],
)
async def test_malformed_urls_are_invalid(url: str) -> None:
    assert await refused_code(UrlGuard(STRICT), url) == "invalid_base_url"
    # Syntax is checked whatever the policy.
    assert await refused_code(UrlGuard(SsrfPolicy(allow_private=True)), url) == "invalid_base_url"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/v1",
        "http://10.1.2.3/v1",
        "http://[::1]:8000/v1",
        "http://[::ffff:127.0.0.1]/v1",
        "http://[::ffff:7f00:1]/v1",
        "http://[fe80::1]/v1",
        "http://0.0.0.0/v1",
        "http://169.254.169.254/latest/meta-data",
        "http://[fd00:ec2::254]/",
        "https://metadata.google.internal/computeMetadata/v1",
    ],
)
async def test_literal_private_and_metadata_addresses_are_refused(url: str) -> None:
    never = resolver_of({})
    assert await refused_code(UrlGuard(STRICT, resolve=never), url) == "base_url_not_allowed"


async def test_names_are_resolved_and_every_address_must_be_public() -> None:
    guard = UrlGuard(
        STRICT,
        resolve=resolver_of(
            {
                "public.test": [PUBLIC],
                "inside.test": ["10.0.0.5"],
                "mixed.test": [PUBLIC, "127.0.0.1"],
                "v6.test": ["::1"],
            }
        ),
    )
    assert (await guard.check("https://public.test/v1")).host == "public.test"
    for host in ("inside.test", "mixed.test", "v6.test"):
        with pytest.raises(UnsafeUrlError) as caught:
            await guard.check(f"https://{host}/v1")
        assert caught.value.code == "base_url_not_allowed"
        assert host in caught.value.message
    assert await refused_code(guard, "https://nowhere.test/v1") == "base_url_unresolvable"


async def test_localhost_is_refused_through_the_system_resolver() -> None:
    guard = UrlGuard(STRICT)
    with pytest.raises(UnsafeUrlError) as caught:
        await guard.check("http://localhost:8000/v1")
    assert caught.value.code == "base_url_not_allowed"
    assert "loopback" in caught.value.message


async def test_allow_private_accepts_loopback_without_resolving() -> None:
    guard = UrlGuard(SsrfPolicy(allow_private=True), resolve=resolver_of({}))
    assert (await guard.check("http://localhost:8000/v1")).port == 8000
    assert (await guard.check("http://127.0.0.1:8000/v1")).ip == ip_address("127.0.0.1")
    assert (await guard.check("http://[::1]/v1")).port == 80
    assert await refused_code(guard, "http://169.254.169.254/") == "base_url_not_allowed"


# ---------------------------------------------------------------- connection time


@contextlib.asynccontextmanager
async def guarded(
    policy: SsrfPolicy, resolver: AbstractResolver | None = None
) -> AsyncIterator[GuardedUpstreamHttp]:
    http = build_guarded_http_client(
        policy,
        connect_timeout=2.0,
        read_timeout=5.0,
        resolver_factory=None if resolver is None else (lambda: resolver),
    )
    try:
        yield http
    finally:
        await http.aclose()


async def get(http: GuardedUpstreamHttp, url: str, *, follow: bool = False) -> int:
    async with http.session.get(url, allow_redirects=follow) as response:
        await response.read()
        return response.status


async def refusal(http: GuardedUpstreamHttp, url: str, *, follow: bool = False) -> str:
    with pytest.raises(aiohttp.ClientError) as caught:
        await get(http, url, follow=follow)
    refused = refusal_of(caught.value)
    assert refused is not None, repr(caught.value)
    return refused.reason


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[FakeOpenAI, str, int]]:
    fake = FakeOpenAI("ssrf-target")
    async with serve_asgi(fake) as url:
        yield fake, url, int(url.rsplit(":", 1)[1])


async def test_a_literal_loopback_address_is_refused_at_connection(
    upstream: tuple[FakeOpenAI, str, int],
) -> None:
    fake, url, _ = upstream
    async with guarded(STRICT) as http:
        assert "loopback" in await refusal(http, f"{url}/v1/models")
    assert fake.stats.requests == 0


async def test_ipv6_loopback_and_mapped_addresses_are_refused_at_connection() -> None:
    fake = FakeOpenAI("ssrf-v6")
    async with serve_asgi(fake, host="::1") as url, guarded(STRICT) as http:
        assert "loopback" in await refusal(http, f"{url}/v1/models")
        port = url.rsplit(":", 1)[1]
        assert "loopback" in await refusal(http, f"http://[::ffff:127.0.0.1]:{port}/v1/models")
    assert fake.stats.requests == 0
    factory = guarded_socket_factory(STRICT)
    for address in (("::1", 80, 0, 0), ("::ffff:127.0.0.1", 80, 0, 0)):
        with pytest.raises(SsrfRefusedError):
            factory((socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", address))


async def test_a_name_resolving_to_loopback_is_refused_at_connection(
    upstream: tuple[FakeOpenAI, str, int],
) -> None:
    fake, _, port = upstream
    async with guarded(STRICT) as http:  # the system resolver: /etc/hosts
        assert "loopback" in await refusal(http, f"http://localhost:{port}/v1/models")
    assert fake.stats.requests == 0


async def test_dns_rebinding_after_the_write_time_check_is_refused(
    upstream: tuple[FakeOpenAI, str, int],
) -> None:
    fake, _, port = upstream
    url = f"http://rebind.test:{port}/v1/models"
    # At write time the name pointed at a public address...
    write_time = UrlGuard(STRICT, resolve=resolver_of({"rebind.test": [PUBLIC]}))
    await write_time.check(url)
    # ...at call time it points inside: nothing is left to connect to.
    dns = TableResolver({"rebind.test": ["127.0.0.1"]})
    async with guarded(STRICT, dns) as http:
        reason = await refusal(http, url)
    assert "rebind.test resolves to 127.0.0.1 is a loopback address" in reason
    assert dns.lookups == ["rebind.test"]
    assert fake.stats.requests == 0


async def test_refused_addresses_are_filtered_out_of_a_lookup(
    upstream: tuple[FakeOpenAI, str, int],
) -> None:
    fake, _, port = upstream
    # The exempt socket address stands for the one acceptable answer of the lookup.
    policy = SsrfPolicy(exempt=frozenset({("127.0.0.1", port)}))
    dns = TableResolver({"mixed.test": ["10.0.0.1", "127.0.0.1"]})
    async with guarded(policy, dns) as http:
        assert await get(http, f"http://mixed.test:{port}/v1/models") == 200
    assert fake.stats.listings == 1


async def test_the_allow_switch_reaches_loopback(upstream: tuple[FakeOpenAI, str, int]) -> None:
    fake, url, port = upstream
    async with guarded(SsrfPolicy(allow_private=True)) as http:
        assert await get(http, f"{url}/v1/models") == 200
        assert await get(http, f"http://localhost:{port}/v1/models") == 200
        # Metadata stays refused, before any packet is sent.
        assert "metadata" in await refusal(http, "http://169.254.169.254/latest/meta-data")
    assert fake.stats.listings == 2


class Redirector:
    """An upstream that answers every request with a redirect to ``location``."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.hits = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.hits += 1
        await send(
            {
                "type": "http.response.start",
                "status": 302,
                "headers": [(b"location", self.location.encode()), (b"content-length", b"0")],
            }
        )
        await send({"type": "http.response.body", "body": b""})


@pytest.mark.parametrize("target", ["loopback", "private"])
async def test_a_redirect_to_a_private_address_is_refused(
    upstream: tuple[FakeOpenAI, str, int], target: str
) -> None:
    fake, url, _ = upstream
    location = f"{url}/v1/models" if target == "loopback" else "http://10.0.0.1/v1/models"
    redirector = Redirector(location)
    async with serve_asgi(redirector) as first_hop:
        first_port = int(first_hop.rsplit(":", 1)[1])
        # The first hop stands in for a public upstream (a test cannot reach one), so
        # exactly its socket address is exempt; the hop it redirects to is judged by
        # the normal rules, and the target fake's port differs from the exempt one.
        policy = SsrfPolicy(exempt=frozenset({("127.0.0.1", first_port)}))
        async with guarded(policy) as http:
            # What Arona does: redirects are not followed at all.
            assert await get(http, f"{first_hop}/v1/models") == 302
            # Were a caller to follow them, every hop still meets the guard.
            reason = await refusal(http, f"{first_hop}/v1/models", follow=True)
    assert ("loopback" if target == "loopback" else "private") in reason
    assert redirector.hits == 2
    assert fake.stats.requests == 0


def test_refusal_of_finds_the_guard_behind_wrappers() -> None:
    inner = SsrfRefusedError("refused: x")
    outer = RuntimeError("wrapped")
    outer.__cause__ = OSError("connect failed")
    outer.__cause__.__context__ = inner
    assert refusal_of(outer) is inner
    assert refusal_of(ExceptionGroup("many", [ValueError("a"), inner])) is inner
    assert refusal_of(ValueError("nothing")) is None
