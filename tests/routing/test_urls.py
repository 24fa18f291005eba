"""Upstream URL building (root-style and path-style bases) and model name matching."""

from __future__ import annotations

import pytest

from app.routing.names import canonical
from app.routing.urls import is_root_style, openai_endpoint, plain_endpoint


@pytest.mark.parametrize(
    ("base", "endpoint", "expected"),
    [
        ("http://vllm:8000", "/chat/completions", "http://vllm:8000/v1/chat/completions"),
        ("http://vllm:8000/", "/chat/completions", "http://vllm:8000/v1/chat/completions"),
        ("http://vllm:8000", "/models", "http://vllm:8000/v1/models"),
        ("http://vllm:8000/", "embeddings", "http://vllm:8000/v1/embeddings"),
        ("  https://api.openai.com/  ", "/models", "https://api.openai.com/v1/models"),
        (
            "https://open.bigmodel.cn/api/coding/paas/v4",
            "/chat/completions",
            "https://open.bigmodel.cn/api/coding/paas/v4/chat/completions",
        ),
        (
            "https://open.bigmodel.cn/api/coding/paas/v4/",
            "/models",
            "https://open.bigmodel.cn/api/coding/paas/v4/models",
        ),
        (
            "https://open.bigmodel.cn/api/coding/paas/v4",
            "/embeddings",
            "https://open.bigmodel.cn/api/coding/paas/v4/embeddings",
        ),
        ("http://gw:9000/v1", "/models", "http://gw:9000/v1/models"),
        ("http://gw:9000/v1/", "/chat/completions", "http://gw:9000/v1/chat/completions"),
    ],
)
def test_openai_endpoint(base: str, endpoint: str, expected: str) -> None:
    assert openai_endpoint(base, endpoint) == expected


@pytest.mark.parametrize(
    ("base", "root"),
    [
        ("http://h:1", True),
        ("http://h:1/", True),
        ("https://open.bigmodel.cn/api/coding/paas/v4", False),
        ("https://open.bigmodel.cn/api/coding/paas/v4/", False),
    ],
)
def test_root_style_detection(base: str, root: bool) -> None:
    assert is_root_style(base) is root


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("http://ollama:11434", "http://ollama:11434/api/chat"),
        ("http://ollama:11434/", "http://ollama:11434/api/chat"),
        ("http://proxy/ollama/", "http://proxy/ollama/api/chat"),
    ],
)
def test_plain_endpoint(base: str, expected: str) -> None:
    assert plain_endpoint(base, "/api/chat") == expected
    assert plain_endpoint(base, "api/chat") == expected


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("llama3", "llama3"),
        ("llama3:latest", "llama3"),
        ("llama3:8b", "llama3:8b"),
        ("qwen2.5:7b-instruct", "qwen2.5:7b-instruct"),
        ("org/model:latest", "org/model"),
        ("gpt-4o-mini", "gpt-4o-mini"),
    ],
)
def test_canonical_name(name: str, key: str) -> None:
    assert canonical(name) == key


def test_latest_and_bare_name_are_one_model_but_tags_differ() -> None:
    assert canonical("llama3") == canonical("llama3:latest")
    assert canonical("llama3:8b") != canonical("llama3")
    assert canonical("llama3:8b") != canonical("llama3:70b")
