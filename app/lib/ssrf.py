"""SSRF guard for upstream URLs chosen by project owners (custom LLM base URLs).

A project owner names a URL and Arona connects to it, with the owner's key and the
project's prompts. Without a guard that URL could point Arona at its own network:
the loopback admin port, a database, another tenant's fake, the cloud metadata
service (instance credentials). One ``SsrfPolicy`` says which addresses are refused;
it is applied at three points:

1. **Write time** (``UrlGuard.check``): the URL's syntax (``http``/``https``, a host,
   no ``user:password@``, no query or fragment), then a literal IP is classified and a
   host name is resolved; any refused address refuses the URL (400 naming it).
   This is feedback for the owner, not the protection: DNS can change afterwards.
2. **Connection time** (``GuardedResolver`` and ``guarded_socket_factory``, installed
   in the aiohttp connector by ``app.lib.http.build_guarded_http_client``): the
   resolver drops every refused address from each lookup, so a name that passed at
   write time and now resolves to 127.0.0.1 (DNS rebinding) has nothing left to
   connect to; the socket factory refuses to open a socket to a refused address
   whatever led there (aiohttp skips the resolver for literal IPs).
3. **Redirects**: Arona never follows them (``allow_redirects=False`` on every
   upstream call). Were a caller to turn following on, each hop would still connect
   through the same connector, so (2) applies to every hop.

Refused: loopback, private (RFC 1918, unique local), link-local, multicast,
unspecified, reserved and every other not globally routable range (CGNAT, benchmark,
documentation), IPv6 forms embedding such an IPv4 address (``::ffff:127.0.0.1``,
6to4, NAT64), and the cloud metadata addresses and names below.
``SsrfPolicy(allow_private=True)`` (``ARONA_CUSTOM_LLM_ALLOW_PRIVATE``) lifts every
refusal except the metadata one: no model endpoint lives there, and instance
credentials are the worst thing to leak.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import KW_ONLY, dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network
from typing import Any
from urllib.parse import urlsplit

from aiohappyeyeballs import AddrInfoType, SocketFactoryType
from aiohttp.abc import AbstractResolver, ResolveResult

IPAddress = IPv4Address | IPv6Address

METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle, ...
        "169.254.170.2",  # AWS ECS task metadata and credentials
        "169.254.169.253",  # AWS VPC DNS
        "169.254.169.123",  # AWS time sync
        "fd00:ec2::254",  # AWS instance metadata over IPv6
        "fd00:ec2::253",  # AWS VPC DNS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure WireServer (a public-range address)
        "192.0.0.192",  # Oracle Cloud (classic)
    )
)
METADATA_HOSTS = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.internal",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
_NAT64 = ip_network("64:ff9b::/96")
RESOLVE_TIMEOUT_SECONDS = 5.0

# Kinds of refused address (``classify``); METADATA is refused even when private
# addresses are allowed.
METADATA = "a cloud metadata address"


class UnsafeUrlError(ValueError):
    """A URL refused at write time. ``code`` is the API error code: ``invalid_base_url``
    (syntax), ``base_url_not_allowed`` (a refused address) or ``base_url_unresolvable``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class SsrfRefusedError(OSError):
    """A connection refused by the guard (an ``OSError``, so aiohttp reports it as a
    failure to connect, like any unreachable address)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EACCES, message)
        self.reason = message

    def __str__(self) -> str:
        return self.reason


def _plain(ip: IPAddress) -> IPAddress:
    """``ip`` without an IPv6 zone (``fe80::1%eth0``): the zone does not change the class."""
    if isinstance(ip, IPv6Address) and ip.scope_id:
        return IPv6Address(int(ip))
    return ip


def _embedded_v4(ip: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 one stands for, where packets go to it."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def classify(ip: IPAddress) -> str | None:
    """What kind of non-public address ``ip`` is (``METADATA``, "loopback", ...), or
    None for a globally routable one."""
    ip = _plain(ip)
    if isinstance(ip, IPv6Address):
        inner = _embedded_v4(ip)
        if inner is not None:
            return classify(inner)
    if ip in METADATA_ADDRESSES:
        return METADATA
    if ip.is_loopback:
        return "loopback"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_private:
        return "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "not globally routable"
    return None


@dataclass(frozen=True, slots=True)
class SsrfPolicy:
    allow_private: bool = False
    """Allow every non-public address except the metadata ones."""
    exempt: frozenset[tuple[str, int]] = frozenset()
    """Exact socket addresses (``("127.0.0.1", 8080)``) allowed although refused
    otherwise: one known local upstream, not its whole network. Metadata addresses
    are never exempt."""

    def refusal(self, ip: IPAddress, port: int | None = None) -> str | None:
        """Why a connection to ``ip`` (and ``port``) is refused, or None."""
        kind = classify(ip)
        if kind is None:
            return None
        if kind != METADATA:
            if self.allow_private:
                return None
            if port is not None and (str(_plain(ip)), port) in self.exempt:
                return None
        article = "an" if kind[0] in "aeiou" else "a"
        what = kind if kind == METADATA else f"{article} {kind} address"
        return f"{_plain(ip)} is {what}"


# ------------------------------------------------------------------ write time


@dataclass(frozen=True, slots=True)
class UrlTarget:
    scheme: str
    host: str
    """Lower case, without IPv6 brackets."""
    port: int
    ip: IPAddress | None
    """The host as an address when it is a literal IP."""


def _invalid(message: str) -> UnsafeUrlError:
    return UnsafeUrlError("invalid_base_url", message)


def _refused(message: str) -> UnsafeUrlError:
    return UnsafeUrlError("base_url_not_allowed", message)


def parse_url(url: str) -> UrlTarget:
    """Check an upstream base URL's syntax; raises ``UnsafeUrlError``."""
    if not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
        raise _invalid(
            "the URL must be ASCII without spaces or control characters "
            "(write an international host name in its xn-- form)"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise _invalid(f"not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise _invalid("the URL must start with http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise _invalid("the URL must not carry credentials (user:password@); send a key instead")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise _invalid("a base URL has no query string or fragment")
    host = parts.hostname
    if not host:
        raise _invalid("the URL has no host")
    if port == 0:
        raise _invalid("port 0 is not a valid port")
    return UrlTarget(
        scheme=scheme,
        host=host,
        port=port or (443 if scheme == "https" else 80),
        ip=_literal_ip(host),
    )


def _literal_ip(host: str) -> IPAddress | None:
    try:
        return ip_address(host)
    except ValueError:
        pass
    try:
        socket.inet_aton(host)
    except OSError:
        return None
    # 127.1, 0x7f000001, 2130706433, 017700000001: resolvers read these as IPv4
    # addresses; only the dotted-quad form is accepted, so what is checked is what
    # gets connected to.
    raise _invalid(f"{host!r} is a non-canonical IPv4 address: write it as a.b.c.d")


Resolve = Callable[[str, int], Awaitable[Iterable[IPAddress]]]
"""A host name and port to the addresses it resolves to (raises ``OSError``)."""


async def system_resolve(host: str, port: int) -> list[IPAddress]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ip_address(info[4][0]) for info in infos]


def is_metadata_host(host: str) -> bool:
    return host.rstrip(".").lower() in METADATA_HOSTS


@dataclass(slots=True, eq=False)
class UrlGuard:
    """The write-time check of upstream URLs under one policy."""

    policy: SsrfPolicy
    _: KW_ONLY
    resolve: Resolve = system_resolve
    timeout: float = RESOLVE_TIMEOUT_SECONDS

    async def check(self, url: str) -> UrlTarget:
        """The parsed URL if every address it leads to is allowed; else ``UnsafeUrlError``.

        With private addresses allowed, host names are not resolved here (the
        connection-time guard still refuses metadata addresses).
        """
        target = parse_url(url)
        if is_metadata_host(target.host):
            raise _refused(f"{target.host} is a cloud metadata service")
        if target.ip is not None:
            why = self.policy.refusal(target.ip, target.port)
            if why is not None:
                raise _refused(f"refused: {why}")
            return target
        if self.policy.allow_private:
            return target
        try:
            async with asyncio.timeout(self.timeout):
                addresses = list(await self.resolve(target.host, target.port))
        except TimeoutError:
            raise UnsafeUrlError(
                "base_url_unresolvable", f"resolving {target.host} timed out"
            ) from None
        except (OSError, UnicodeError) as exc:
            raise UnsafeUrlError(
                "base_url_unresolvable", f"{target.host} could not be resolved ({exc})"
            ) from None
        if not addresses:
            raise UnsafeUrlError("base_url_unresolvable", f"{target.host} has no address")
        for ip in addresses:
            why = self.policy.refusal(ip, target.port)
            if why is not None:
                raise _refused(f"refused: {target.host} resolves to {why}")
        return target


# ------------------------------------------------------------- connection time


class GuardedResolver(AbstractResolver):
    """An aiohttp resolver that drops refused addresses from every lookup."""

    def __init__(self, policy: SsrfPolicy, inner: AbstractResolver) -> None:
        self._policy = policy
        self._inner = inner

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if is_metadata_host(host):
            raise SsrfRefusedError(f"refused: {host} is a cloud metadata service")
        results = await self._inner.resolve(host, port, family)
        allowed: list[ResolveResult] = []
        refused: list[str] = []
        for result in results:
            why = self._policy.refusal(ip_address(result["host"]), result["port"])
            if why is None:
                allowed.append(result)
            else:
                refused.append(why)
        if not allowed:
            detail = refused[0] if refused else "no address"
            raise SsrfRefusedError(f"refused: {host} resolves to {detail}")
        return allowed

    async def close(self) -> None:
        await self._inner.close()


def guarded_socket_factory(policy: SsrfPolicy) -> SocketFactoryType:
    """Opens a socket only towards an allowed address (aiohttp's last step before
    ``connect``: literal IPs and resolved names alike pass here)."""

    def open_socket(addr_info: AddrInfoType) -> socket.socket:
        family, type_, proto, _, address = addr_info
        host: Any = address[0]
        if not isinstance(host, str):
            raise SsrfRefusedError("refused: not an IP socket address")
        why = policy.refusal(ip_address(host), int(address[1]))
        if why is not None:
            raise SsrfRefusedError(f"refused: {why}")
        return socket.socket(family=family, type=type_, proto=proto)

    return open_socket


def refusal_of(exc: BaseException) -> SsrfRefusedError | None:
    """The guard's refusal behind a failed request (aiohttp wraps it), if any."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, SsrfRefusedError):
            return current
        todo.append(getattr(current, "os_error", None))
        todo.append(current.__cause__)
        todo.append(current.__context__)
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
    return None
