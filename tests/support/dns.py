"""A DNS stand-in for the SSRF tests: what a name resolves to is what the test says,
and can change between the write-time check and the connection (DNS rebinding)."""

from __future__ import annotations

import socket

from aiohttp.abc import AbstractResolver, ResolveResult


class TableResolver(AbstractResolver):
    """A DNS stand-in: names to addresses from a table a test can change."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.lookups: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.lookups.append(host)
        if host not in self.table:
            raise OSError(f"{host} not found")
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=0,
            )
            for address in self.table[host]
        ]

    async def close(self) -> None:
        return None
