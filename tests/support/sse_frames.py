"""Reading a dashboard stream's SSE events off a streamed httpx response."""

from __future__ import annotations

import asyncio
import time

import httpx


class SseFrames:
    """SSE events off one streamed response."""

    def __init__(self, response: httpx.Response) -> None:
        self._chunks = response.aiter_text()
        self._text = ""

    async def until(self, name: str, containing: str = "", within: float = 20) -> str:
        """The data of the next ``name`` event whose data contains ``containing``."""
        deadline = time.monotonic() + within
        while True:
            while "\n\n" in self._text:
                block, self._text = self._text.split("\n\n", 1)
                lines = block.split("\n")
                event = next((line[7:] for line in lines if line.startswith("event: ")), None)
                data = "\n".join(line[6:] for line in lines if line.startswith("data: "))
                if event == name and containing in data:
                    return data
            async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                self._text += await anext(self._chunks)
