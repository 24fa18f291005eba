"""Upstream endpoint URLs from a registered base URL.

A base whose path is empty or ``/`` is root-style (``{base}/v1/chat/completions``);
a base with a path is path-style, the endpoint is appended directly
(``https://open.bigmodel.cn/api/coding/paas/v4`` -> ``.../v4/chat/completions``).
"""

from __future__ import annotations

from urllib.parse import urlsplit


def normalize_base(url: str) -> str:
    return url.strip().rstrip("/")


def is_root_style(url: str) -> bool:
    return urlsplit(normalize_base(url)).path in ("", "/")


def openai_endpoint(base_url: str, endpoint: str) -> str:
    """``endpoint`` is ``/chat/completions``, ``/models`` or ``/embeddings``."""
    base = normalize_base(base_url)
    suffix = "/" + endpoint.lstrip("/")
    return f"{base}/v1{suffix}" if is_root_style(base) else f"{base}{suffix}"


def plain_endpoint(base_url: str, path: str) -> str:
    """Append ``path`` as-is (Ollama's ``/api/chat``), without doubling slashes."""
    return normalize_base(base_url) + "/" + path.lstrip("/")
