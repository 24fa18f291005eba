"""JSON-RPC against malformed input: NUL in stored params, deep nesting, huge offsets.
Each is a JSON-RPC error naming what is wrong, never a -32603 internal error."""

from __future__ import annotations

from tests.support.rpc import Replica, call, error, post_rpc, server, video_setup
from tests.support.video import Minimax, minimax, new_tenant, video_pg_settings

__all__ = ["minimax", "server", "video_pg_settings"]

PARSE, INVALID_PARAMS = -32700, -32602


async def test_nul_in_video_create_names_the_param(server: Replica, minimax: Minimax) -> None:
    setup = await video_setup(server, minimax)
    answer = await call(
        server.http,
        setup.tenant.key,
        "video.create",
        {"model": setup.model, "prompt": "a cat\x00 on a mat"},
    )
    found = error(answer, INVALID_PARAMS)
    assert found["data"]["code"] == "unsupported_character"
    assert found["data"]["param"] == "prompt"
    assert found["data"]["status"] == 400


async def test_json_nested_a_thousand_deep_is_a_parse_error(server: Replica) -> None:
    headers = (await new_tenant(server.http)).key
    body = b'{"jsonrpc": "2.0", "method": "video.list", "id": 1, "params": {"x": '
    body += b"[" * 1000 + b"]" * 1000 + b"}}"
    response = await post_rpc(server.http, headers, body)
    assert response.status_code == 200, response.text
    found = error(response.json(), PARSE)
    assert found["data"] == {"code": "json_too_deep"}


async def test_an_offset_past_any_database_integer_is_invalid_params(server: Replica) -> None:
    headers = (await new_tenant(server.http)).key
    for offset in (2**63, 10**30, -1):
        answer = await call(server.http, headers, "video.list", {"offset": offset})
        found = error(answer, INVALID_PARAMS)
        assert found["data"]["param"] == "offset", found
