"""Helpers for driving the runtime API end to end: a runtime token, profiles, a pool
of fake vLLM servers, conversations, and SSE chat calls read event by event."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec

from app.fakes.serve import serve_asgi
from app.fakes.vllm_upstream import FakeVllm
from tests.support.gateway import ADMIN, GatewayEnv, unique
from tests.support.helpers import bearer


@dataclass
class ChatResult:
    status: int
    headers: httpx.Headers
    events: list[dict[str, Any]] = field(default_factory=list)
    """Decoded ``data:`` events (not ``[DONE]``); error events carry ``"event": "error"``."""
    done: bool = False
    body: Any = None
    """The JSON body of a non-streamed reply or an error."""

    @property
    def text(self) -> str:
        parts = []
        for event in self.events:
            for choice in event.get("choices", []):
                content = (choice.get("delta") or {}).get("content")
                if content:
                    parts.append(content)
        return "".join(parts)

    @property
    def usage(self) -> dict[str, Any] | None:
        found = [e["usage"] for e in self.events if e.get("usage")]
        return found[-1] if found else None

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == "error"]


def parse_sse(raw: bytes) -> tuple[list[dict[str, Any]], bool]:
    events: list[dict[str, Any]] = []
    done = False
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        name, data = "", b""
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                data = line[5:].strip()
        if not data:
            continue
        if data == b"[DONE]":
            done = True
            continue
        event = msgspec.json.decode(data)
        if name:
            event["event"] = name
        events.append(event)
    return events, done


@dataclass
class RuntimeEnv:
    gw: GatewayEnv
    token: str
    headers: dict[str, str]
    profiles: list[str] = field(default_factory=list)

    @property
    def http(self) -> httpx.AsyncClient:
        return self.gw.http

    async def vllm(self, tag: str = "vllm", **options: Any) -> tuple[FakeVllm, str]:
        fake = FakeVllm(unique(tag), **options)
        url = await self.gw.stack.enter_async_context(serve_asgi(fake))
        return fake, url

    async def pool(
        self, model: str, tags_per_backend: list[list[str]], **options: Any
    ) -> list[tuple[str, FakeVllm]]:
        """Fake vLLM servers serving ``model``, registered with the given tags."""
        out = []
        for tags in tags_per_backend:
            fake, url = await self.vllm(models=[model], **options)
            name = unique("pool")
            await self.register(name, url, tags=tags)
            out.append((name, fake))
        return out

    async def register(self, name: str, url: str, *, tags: list[str], **fields: Any) -> None:
        """Register a fake vLLM server; ``fields`` are more of the registration's
        fields (``max_concurrency``)."""
        response = await self.http.post(
            "/api/admin/backends",
            json={"name": name, "type": "vllm", "url": url, "tags": tags, **fields},
            headers=ADMIN,
        )
        assert response.status_code == 201, response.text
        self.gw.registered.append(name)
        await self.gw.wait_health(name, "healthy")

    async def profile(self, base_model: str, **fields: Any) -> str:
        profile_id = fields.pop("id", None) or unique("p")
        payload = {
            "id": profile_id,
            "name": fields.pop("name", profile_id),
            "baseModel": base_model,
            "contextWindowTokens": 8192,
            "maxOutputTokens": 1024,
            **fields,
        }
        response = await self.http.post("/api/admin/model-profiles", json=payload, headers=ADMIN)
        assert response.status_code == 201, response.text
        self.profiles.append(profile_id)
        return profile_id

    async def conversation(self, **fields: Any) -> str:
        response = await self.http.post(
            "/api/runtime/conversations", json=fields, headers=self.headers
        )
        assert response.status_code == 201, response.text
        conversation_id: str = response.json()["id"]
        return conversation_id

    async def messages(self, conversation_id: str) -> list[dict[str, Any]]:
        response = await self.http.get(
            f"/api/runtime/conversations/{conversation_id}/messages", headers=self.headers
        )
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    async def chat(
        self,
        conversation_id: str,
        text: str = "Hello",
        *,
        headers: dict[str, str] | None = None,
        **fields: Any,
    ) -> ChatResult:
        body = {
            "conversationId": conversation_id,
            "messages": [{"role": "user", "content": text}],
            **fields,
        }
        async with self.http.stream(
            "POST", "/api/runtime/chat", json=body, headers=headers or self.headers
        ) as response:
            raw = await response.aread()
        result = ChatResult(status=response.status_code, headers=response.headers)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            result.events, result.done = parse_sse(raw)
        else:
            result.body = msgspec.json.decode(raw) if raw else None
        return result

    async def pins(self) -> list[dict[str, Any]]:
        response = await self.http.get("/api/admin/pins", headers=ADMIN)
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    async def cleanup(self) -> None:
        for profile_id in reversed(self.profiles):
            with contextlib.suppress(httpx.HTTPError):
                await self.http.delete(f"/api/admin/model-profiles/{profile_id}", headers=ADMIN)


async def runtime_env(gw: GatewayEnv) -> RuntimeEnv:
    response = await gw.http.post(
        f"/api/projects/{gw.project_id}/runtime-tokens",
        json={"name": "runtime"},
        headers=gw.user_headers,
    )
    assert response.status_code == 201, response.text
    token = response.json()["token"]
    return RuntimeEnv(gw=gw, token=token, headers=bearer(token))
