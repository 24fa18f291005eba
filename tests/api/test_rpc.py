"""JSON-RPC 2.0 protocol behaviour over ``POST /api/rpc`` and the WebSocket: standard
errors, batches, notifications, the application error mapping, and credentials."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import msgspec
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from app.domain.rpc.dispatch import Dispatcher, Method
from app.lib.settings import Settings
from tests.support.api import create_runtime_token
from tests.support.helpers import bearer, new_user
from tests.support.rpc import (
    Replica,
    call,
    error,
    post_rpc,
    request,
    result,
    rpc_socket,
    serve,
    server,
    video_setup,
)
from tests.support.settings import AppFactory, with_settings
from tests.support.video import Minimax, minimax, new_tenant, video_pg_settings

__all__ = ["minimax", "server", "video_pg_settings"]

PARSE, INVALID_REQUEST, NOT_FOUND, INVALID_PARAMS, APP = -32700, -32600, -32601, -32602, -32000


async def _tenant_headers(server: Replica) -> dict[str, str]:
    return (await new_tenant(server.http)).key


async def _post(server: Replica, headers: dict[str, str], body: Any) -> Any:
    response = await post_rpc(server.http, headers, body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


async def test_a_body_that_is_not_json_is_a_parse_error(server: Replica) -> None:
    headers = await _tenant_headers(server)
    for body in (b"{not json", b"", b'{"jsonrpc": "2.0", "method": "video.list", "id": 1'):
        answer = await _post(server, headers, body)
        assert answer["jsonrpc"] == "2.0"
        assert answer["id"] is None
        error(answer, PARSE)


INVALID_REQUESTS: list[tuple[Any, Any]] = [
    ({"jsonrpc": "1.0", "method": "video.list", "id": 7}, 7),
    ({"method": "video.list", "id": "x"}, "x"),
    ({"jsonrpc": "2.0", "method": 1, "params": "bar", "id": 3}, 3),
    ({"jsonrpc": "2.0", "method": "video.list", "params": "bar", "id": 4}, 4),
    ({"jsonrpc": "2.0", "method": "video.list", "id": {"no": "objects"}}, None),
    ({"jsonrpc": "2.0", "method": "video.list", "id": True}, None),
    ("video.list", None),
    (42, None),
]


async def test_an_invalid_request_object_is_refused_with_its_id_when_readable(
    server: Replica,
) -> None:
    headers = await _tenant_headers(server)
    for body, echoed in INVALID_REQUESTS:
        answer = await _post(server, headers, body)
        assert answer["id"] == echoed, (body, answer)
        found = error(answer, INVALID_REQUEST)
        assert found["data"] == {"code": "invalid_request", "status": 400}, (body, answer)


async def test_batches_answer_as_arrays_in_order(server: Replica) -> None:
    headers = await _tenant_headers(server)
    # An empty batch is one error, not an empty array.
    empty = await _post(server, headers, [])
    assert empty["id"] is None
    error(empty, INVALID_REQUEST)
    # Members that are not objects get an error each.
    answers = await _post(server, headers, [1, 2])
    assert isinstance(answers, list)
    assert len(answers) == 2
    for answer in answers:
        assert answer["id"] is None
        error(answer, INVALID_REQUEST)
    mixed = [
        request("video.list", {"limit": 5}, id="a"),
        {"jsonrpc": "2.0", "method": "video.list"},  # a notification: no answer
        request("video.nope", id="b"),
        {"jsonrpc": "2.0", "method": 5, "id": "c"},
        request("video.get", {"job_id": "vid_" + "0" * 32}, id="d"),
    ]
    answers = await _post(server, headers, mixed)
    assert [a["id"] for a in answers] == ["a", "b", "c", "d"]
    assert result(answers[0]) == {"items": [], "total": 0, "limit": 5, "offset": 0}
    error(answers[1], NOT_FOUND)
    error(answers[2], INVALID_REQUEST)
    assert error(answers[3], APP)["data"]["code"] == "video_job_not_found"


async def test_a_batch_over_the_limit_is_refused_whole(server: Replica) -> None:
    headers = await _tenant_headers(server)
    answer = await _post(server, headers, [request("video.list") for _ in range(101)])
    assert isinstance(answer, dict)
    error(answer, INVALID_REQUEST)


async def test_notifications_get_no_answer_even_when_they_fail(server: Replica) -> None:
    headers = await _tenant_headers(server)
    for body in (
        {"jsonrpc": "2.0", "method": "video.list"},
        {"jsonrpc": "2.0", "method": "video.unknown"},
        {"jsonrpc": "2.0", "method": "video.get", "params": {"job_id": "vid_nope"}},
        [{"jsonrpc": "2.0", "method": "video.list"}, {"jsonrpc": "2.0", "method": "x"}],
    ):
        response = await post_rpc(server.http, headers, body)
        assert response.status_code == 204, response.text
        assert response.content == b""
    # ``"id": null`` is a request (discouraged, but answered).
    answer = await _post(server, headers, {"jsonrpc": "2.0", "method": "video.list", "id": None})
    assert answer["id"] is None
    assert result(answer)["total"] == 0


async def test_unknown_methods_and_socket_only_methods_over_http(server: Replica) -> None:
    headers = await _tenant_headers(server)
    found = error(await call(server.http, headers, "video.delete", {"job_id": "x"}), NOT_FOUND)
    assert "video.delete" in found["message"]
    found = error(
        await call(server.http, headers, "video.subscribe", {"stream_id": "s"}), NOT_FOUND
    )
    assert "/api/rpc/ws" in found["message"]
    assert "/api/rpc/events" in found["message"]


BAD_PARAMS: list[tuple[str, dict[str, Any], str]] = [
    ("video.get", {}, "job_id"),
    ("video.get", {"job_id": ""}, "job_id"),
    ("video.get", {"job_id": 5}, "job_id"),
    ("video.get", {"job_id": "vid_x", "extra": 1}, "extra"),
    ("video.cancel", {}, "job_id"),
    ("video.list", {"limit": 0}, "limit"),
    ("video.list", {"limit": 101}, "limit"),
    ("video.list", {"offset": -1}, "offset"),
    ("video.list", {"limit": "ten"}, "limit"),
    ("video.create", {"prompt": "a cat"}, "model"),
    ("video.create", {"model": "m"}, "prompt"),
    ("video.create", {"model": "m", "prompt": "p", "width": "wide"}, "width"),
    (
        "video.create",
        {"model": "m", "prompt": "p", "images": [{"data_base64": "x"}]},
        "images[0].mime_type",
    ),
    ("video.create", {"model": "m", "prompt": "p", "images": [7]}, "images[0]"),
    ("video.create", {"model": "m", "prompt": "p", "colour": "red"}, "colour"),
]


async def test_params_that_do_not_fit_are_invalid_params_naming_the_field(
    server: Replica,
) -> None:
    headers = await _tenant_headers(server)
    for method, params, param in BAD_PARAMS:
        found = error(await call(server.http, headers, method, params), INVALID_PARAMS)
        assert found["data"] == {"code": "invalid_request", "status": 400, "param": param}, (
            method,
            params,
            found,
        )


async def test_positional_params_are_refused(server: Replica) -> None:
    headers = await _tenant_headers(server)
    found = error(await call(server.http, headers, "video.list", [10, 0]), INVALID_PARAMS)
    assert "by name" in found["message"]


async def test_application_errors_keep_their_code_status_and_param(
    server: Replica, minimax: Minimax
) -> None:
    setup = await video_setup(server, minimax)
    headers = setup.tenant.key
    # 404 from the service: -32000 with the REST code and status.
    found = error(await call(server.http, headers, "video.get", {"job_id": "vid_nope"}), APP)
    assert found["data"] == {"code": "video_job_not_found", "status": 404, "param": "id"}
    unknown = {"model": "no-such-video-model", "prompt": "a cat"}
    found = error(await call(server.http, headers, "video.create", unknown), APP)
    assert found["data"]["code"] == "model_not_found"
    assert found["data"]["status"] == 404
    # A 400 of the service's own checks is -32602, with the field.
    blank = {"model": setup.model, "prompt": "   "}
    found = error(await call(server.http, headers, "video.create", blank), INVALID_PARAMS)
    assert found["data"] == {"code": "invalid_request", "status": 400, "param": "prompt"}
    bad_image = {"model": setup.model, "prompt": "p", "images": ["data:image/png;base64,@@@"]}
    found = error(await call(server.http, headers, "video.create", bad_image), INVALID_PARAMS)
    assert found["data"]["param"] == "images[0]"
    # 409: cancelling a job twice.
    made = {"model": setup.model, "prompt": "[stuck] a cat"}
    job_id = result(await call(server.http, headers, "video.create", made))["job_id"]
    cancelled = result(await call(server.http, headers, "video.cancel", {"job_id": job_id}))
    assert cancelled["status"] == "cancelled"
    found = error(await call(server.http, headers, "video.cancel", {"job_id": job_id}), APP)
    assert found["data"]["code"] == "video_job_finished"
    assert found["data"]["status"] == 409


def _assert_refusal(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["jsonrpc"] == "2.0"
    assert body["id"] is None
    found = error(body, APP)
    assert found["data"]["code"] == code
    assert found["data"]["status"] == status


async def test_credentials_are_required_on_every_transport(server: Replica) -> None:
    message = request("video.list")
    response = await post_rpc(server.http, {}, message)
    _assert_refusal(response, 401, "missing_credentials")
    assert response.headers["www-authenticate"] == "Bearer"
    _assert_refusal(
        await post_rpc(server.http, bearer("ak-not-a-key"), message), 401, "invalid_api_key"
    )
    _assert_refusal(
        await post_rpc(server.http, {"Authorization": "Basic eDp5"}, message),
        401,
        "invalid_authorization",
    )
    # A runtime token is for the runtime API, not for /v1 or JSON-RPC.
    _, owner = await new_user(server.http)  # type: ignore[arg-type]
    project = (await server.http.post("/api/projects", json=_project(), headers=owner)).json()
    runtime = await create_runtime_token(server.http, project["id"], owner)  # type: ignore[arg-type]
    _assert_refusal(
        await post_rpc(server.http, bearer(runtime["token"]), message),
        403,
        "principal_not_allowed",
    )
    # The SSE sidecar and the WebSocket refuse the same way, before anything else.
    events = await server.http.get("/api/rpc/events", params={"session": "abc"})
    _assert_refusal(events, 401, "missing_credentials")
    for headers, status, code in (
        ({}, 401, "missing_credentials"),
        (bearer("ak-not-a-key"), 401, "invalid_api_key"),
        (bearer(runtime["token"]), 403, "principal_not_allowed"),
    ):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(server.ws_url, additional_headers=headers, open_timeout=5):
                pass
        refusal = refused.value.response
        assert refusal.status_code == status
        body = msgspec.json.decode(refusal.body or b"")
        assert error(body, APP)["data"]["code"] == code


def _project() -> dict[str, str]:
    return {"name": "Rpc", "slug": f"rpc-{uuid.uuid4().hex[:10]}"}


async def test_a_user_token_names_its_project_and_sees_that_projects_jobs(
    server: Replica,
) -> None:
    _, user = await new_user(server.http)  # type: ignore[arg-type]
    response = await post_rpc(server.http, user, request("video.list", {}))
    assert error(response.json(), INVALID_PARAMS)["data"]["code"] == "project_required"
    project = (await server.http.post("/api/projects", json=_project(), headers=user)).json()
    member = {**user, "X-Arona-Project": project["id"]}
    answer = await call(server.http, member, "video.list", {})
    assert result(answer) == {"items": [], "total": 0, "limit": 20, "offset": 0}
    stranger = {**user, "X-Arona-Project": str(uuid.uuid4())}
    response = await post_rpc(server.http, stranger, request("video.list", {}))
    assert error(response.json(), APP)["data"]["code"] == "project_not_found"


async def test_http_refusals_are_json_rpc_shaped(
    video_pg_settings: Settings, make_app: AppFactory
) -> None:
    small = with_settings(video_pg_settings, max_body_bytes=2048)
    async with serve(make_app(small)) as replica:
        headers = await _tenant_headers(replica)
        response = await replica.http.get("/api/rpc", headers=headers)
        assert response.status_code == 405
        assert response.headers["allow"] == "POST"
        assert error(response.json(), INVALID_REQUEST)["data"]["status"] == 405
        big = request("video.create", {"model": "m", "prompt": "x" * 4096})
        response = await post_rpc(replica.http, headers, big)
        assert response.status_code == 413, response.text
        found = error(response.json(), INVALID_REQUEST)
        assert found["data"] == {"code": "request_too_large", "status": 413}
        # The same limit holds per WebSocket message; the socket stays usable.
        async with rpc_socket(replica, headers) as socket:
            await socket.send(big)
            found = error(await socket.answer(), INVALID_REQUEST)
            assert found["data"]["code"] == "request_too_large"
            assert result(await socket.call("video.list"))["total"] == 0


async def test_the_websocket_speaks_the_same_protocol(server: Replica) -> None:
    headers = await _tenant_headers(server)
    async with rpc_socket(server, headers) as socket:
        await socket.ws.send("{oops")
        answer = await socket.answer()
        assert answer["id"] is None
        error(answer, PARSE)
        await socket.send([])
        error(await socket.answer(), INVALID_REQUEST)
        # A notification gets nothing back: the next answer is the next request's.
        await socket.send({"jsonrpc": "2.0", "method": "video.list"})
        answer = await socket.call("video.list", {"limit": 1})
        assert result(answer) == {"items": [], "total": 0, "limit": 1, "offset": 0}
        await socket.send([request("video.list", id=1), request("video.nope", id=2)])
        batch = await socket.answer()
        assert [a["id"] for a in batch] == [1, 2]
        error(batch[1], NOT_FOUND)
        found = error(await socket.call("video.get", {}), INVALID_PARAMS)
        assert found["data"]["param"] == "job_id"
        # Binary frames carry JSON too.
        await socket.ws.send(b'{"jsonrpc": "2.0", "method": "video.list", "id": 9}')
        assert (await socket.answer())["id"] == 9
        found = error(await socket.call("video.subscribe", {"stream_id": "f" * 32}), APP)
        assert found["data"] == {"code": "video_stream_not_found", "status": 404}
        await socket.quiet(0.2)


async def test_a_failing_method_is_an_internal_error_without_details() -> None:
    """A bug in a method (not an application error) is -32603: logged server side,
    the client sees the correlation id only, and the dispatcher keeps working."""

    class Nothing(msgspec.Struct):
        pass

    async def broken(ctx: None, params: Nothing) -> None:
        raise RuntimeError("secret detail")

    async def fine(ctx: None, params: Nothing) -> str:
        return "ok"

    dispatcher: Dispatcher[None] = Dispatcher(
        [Method("broken", Nothing, broken), Method("fine", Nothing, fine)],
        request_id=lambda: "req-123",
    )
    body = msgspec.json.encode([request("broken", id=1), request("fine", id=2)])
    answer = await dispatcher.handle(body, None)
    assert answer is not None
    broken_answer, fine_answer = msgspec.json.decode(answer)
    found = error(broken_answer, -32603)
    assert found == {
        "code": -32603,
        "message": "internal error (request id req-123)",
        "data": {"code": "internal_error", "status": 500},
    }
    assert "secret" not in answer.decode()
    assert result(fine_answer) == "ok"
    # As a notification, even a bug gets no answer.
    silent = msgspec.json.encode({"jsonrpc": "2.0", "method": "broken"})
    assert await dispatcher.handle(silent, None) is None
