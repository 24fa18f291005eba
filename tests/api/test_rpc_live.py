"""Video jobs through JSON-RPC end to end: HTTP, the WebSocket's notifications and the
SSE sidecar, with the fake MiniMax (a real HTTP server) driving each lifecycle."""

from __future__ import annotations

import asyncio
from typing import Any

from app.fakes.minimax_upstream import VIDEO_BYTES
from tests.support.rpc import (
    PRICE,
    Replica,
    SseStream,
    assert_forward_only,
    call,
    error,
    read_sse,
    rest_job,
    result,
    rpc_socket,
    server,
    video_setup,
)
from tests.support.video import (
    Minimax,
    create_job,
    minimax,
    new_tenant,
    video_pg_settings,
    wait_status,
)

__all__ = ["minimax", "server", "video_pg_settings"]

APP = -32000


async def _open_sse(
    replica: Replica, headers: dict[str, str], stream_id: str
) -> asyncio.Task[SseStream]:
    """Read the sidecar in the background; returns once the response has started."""
    opened = asyncio.Event()
    task = asyncio.create_task(read_sse(replica.http, headers, stream_id, opened=opened))
    async with asyncio.timeout(10):
        await opened.wait()
    return task


def _notes(stream: SseStream) -> list[tuple[str, dict[str, Any]]]:
    assert stream.status == 200, stream.events
    assert stream.content_type.startswith("text/event-stream")
    assert stream.ended
    return stream.events


async def test_a_job_over_the_websocket_notifies_until_done(
    server: Replica, minimax: Minimax
) -> None:
    setup = await video_setup(server, minimax)
    headers = setup.tenant.key
    async with rpc_socket(server, headers) as socket:
        answer = await socket.call("video.create", {"model": setup.model, "prompt": "a cat"})
        created = result(answer)
        assert set(created) == {"job_id", "stream_id"}
        notes = await socket.stream(created["stream_id"])
        await socket.quiet(0.3)  # nothing after the terminal event
    assert_forward_only(notes)
    # The answer came before any notification of the job it created.
    assert socket.log[0]["id"] == answer["id"]
    first_method, first = notes[0]
    assert first_method == "video.progress"
    assert first["job_id"] == created["job_id"]
    assert first["stream_id"] == created["stream_id"]
    assert first["status"] in ("queued", "running")
    assert any(p.get("status") == "running" for _, p in notes), notes
    method, done = notes[-1]
    assert method == "video.done"
    assert set(done) == {"job_id", "stream_id", "result", "cost"}
    assert done["job_id"] == created["job_id"]
    assert done["cost"] == PRICE
    download = await server.http.get(done["result"]["url"])
    assert download.content == VIDEO_BYTES
    job = await rest_job(server, headers, created["job_id"])
    assert job["status"] == "done"
    assert job["result"] == done["result"]
    assert job["cost"] == done["cost"]


async def test_a_job_over_http_with_the_sse_sidecar(server: Replica, minimax: Minimax) -> None:
    setup = await video_setup(server, minimax)
    headers = setup.tenant.key
    params = {"model": setup.model, "prompt": "a dog", "duration_seconds": 6}
    created = result(await call(server.http, headers, "video.create", params))
    reader = await _open_sse(server, headers, created["stream_id"])
    notes = _notes(await reader)
    assert_forward_only(notes)
    method, done = notes[-1]
    assert method == "video.done"
    job = result(await call(server.http, headers, "video.get", {"job_id": created["job_id"]}))
    assert job["id"] == created["job_id"]
    assert job["stream_id"] == created["stream_id"]
    assert job["status"] == "done"
    assert job["progress"] == 100
    assert job["result"] == done["result"]
    assert job["cost"] == done["cost"] == PRICE
    listed = result(await call(server.http, headers, "video.list", {"limit": 1}))
    assert listed["total"] == 1
    assert listed["limit"] == 1
    assert listed["offset"] == 0
    assert listed["items"] == [job]
    assert result(await call(server.http, headers, "video.list", {"offset": 1}))["items"] == []


async def test_the_socket_and_the_sidecar_see_the_same_job(
    server: Replica, minimax: Minimax
) -> None:
    setup = await video_setup(server, minimax)
    headers = setup.tenant.key
    async with rpc_socket(server, headers) as socket:
        created = result(
            await socket.call("video.create", {"model": setup.model, "prompt": "[slow:4] owl"})
        )
        reader = await _open_sse(server, headers, created["stream_id"])
        on_socket = await socket.stream(created["stream_id"])
    on_sidecar = _notes(await reader)
    assert_forward_only(on_socket)
    assert_forward_only(on_sidecar)
    assert on_sidecar[-1] == on_socket[-1]
    assert on_sidecar[-1][0] == "video.done"
    # Whatever the sidecar saw after its replay, the socket saw too.
    assert all(note in on_socket for note in on_sidecar[1:]), (on_socket, on_sidecar)


async def test_a_late_subscriber_gets_the_terminal_event_from_replay(
    server: Replica, minimax: Minimax
) -> None:
    setup = await video_setup(server, minimax)
    headers = setup.tenant.key
    done_job = await create_job(server.http, headers, setup.model, "a finished cat")
    failed_job = await create_job(server.http, headers, setup.model, "[fail:no dice] a dog")
    for job in (done_job, failed_job):
        await wait_status(server.http, headers, job["id"], ("done", "failed"))
    final = await rest_job(server, headers, done_job["id"])

    async with rpc_socket(server, headers) as socket:
        answer = result(await socket.call("video.subscribe", {"stream_id": done_job["stream_id"]}))
        assert answer == {
            "job_id": done_job["id"],
            "stream_id": done_job["stream_id"],
            "status": "done",
            "progress": 100,
        }
        notes = await socket.stream(done_job["stream_id"], within=5)
        assert notes == [
            (
                "video.done",
                {
                    "job_id": done_job["id"],
                    "stream_id": done_job["stream_id"],
                    "result": final["result"],
                    "cost": PRICE,
                },
            )
        ]
        result(await socket.call("video.subscribe", {"stream_id": failed_job["stream_id"]}))
        method, params = await socket.next_note(failed_job["stream_id"], within=5)
        assert method == "video.failed"
        assert "no dice" in params["error"]
        await socket.quiet(0.3)

    late = _notes(await read_sse(server.http, headers, done_job["stream_id"], within=10))
    assert late == notes
    failed = _notes(await read_sse(server.http, headers, failed_job["stream_id"], within=10))
    assert [m for m, _ in failed] == ["video.failed"]
    assert "no dice" in failed[0][1]["error"]


async def test_subscribing_to_a_job_created_over_rest_follows_it_to_the_end(
    server: Replica, minimax: Minimax
) -> None:
    setup = await video_setup(server, minimax)
    headers = setup.tenant.key
    job = await create_job(server.http, headers, setup.model, "[slow:6] a horse")
    async with rpc_socket(server, headers) as socket:
        result(await socket.call("video.subscribe", {"stream_id": job["stream_id"]}))
        # Subscribing twice is harmless: still one terminal event.
        result(await socket.call("video.subscribe", {"stream_id": job["stream_id"]}))
        notes = await socket.stream(job["stream_id"])
    assert_forward_only(notes)
    assert notes[-1][0] == "video.done"


async def test_cancel_ends_the_stream_with_failed_cancelled(
    server: Replica, minimax: Minimax
) -> None:
    setup = await video_setup(server, minimax)
    headers = setup.tenant.key
    async with rpc_socket(server, headers) as socket:
        created = result(
            await socket.call("video.create", {"model": setup.model, "prompt": "[stuck] a fox"})
        )
        stream_id = created["stream_id"]
        while (await socket.next_note(stream_id))[1].get("status") != "running":
            pass
        reader = await _open_sse(server, headers, stream_id)
        # Cancelled over HTTP: the socket hears of it all the same.
        cancelled = result(
            await call(server.http, headers, "video.cancel", {"job_id": created["job_id"]})
        )
        assert cancelled["status"] == "cancelled"
        assert cancelled["error"]["message"] == "cancelled"
        notes = await socket.stream(stream_id)
        expected = ("video.failed", {**created, "error": "cancelled"})
        assert notes[-1] == expected
        assert_forward_only(notes)
        # Cancelling a finished job over the socket: 409 as an application error.
        found = error(await socket.call("video.cancel", {"job_id": created["job_id"]}), APP)
        assert found["data"] == {"code": "video_job_finished", "status": 409}
        await socket.quiet(0.3)
    sidecar = _notes(await reader)
    assert sidecar[-1] == expected
    late = _notes(await read_sse(server.http, headers, stream_id, within=10))
    assert late == [expected]


async def test_another_projects_jobs_and_streams_are_not_found(
    server: Replica, minimax: Minimax
) -> None:
    setup = await video_setup(server, minimax)
    mine = setup.tenant.key
    created = result(
        await call(server.http, mine, "video.create", {"model": setup.model, "prompt": "[stuck] x"})
    )
    stranger = await new_tenant(server.http)
    other = stranger.key
    # Another project's owner, charging their own project: not this project's jobs.
    user = {**stranger.owner, "X-Arona-Project": stranger.project_id}
    for headers in (other, user):
        for method in ("video.get", "video.cancel"):
            answer = await call(server.http, headers, method, {"job_id": created["job_id"]})
            assert error(answer, APP)["data"]["code"] == "video_job_not_found"
        listed = result(await call(server.http, headers, "video.list", {}))
        assert listed["total"] == 0
        sidecar = await read_sse(server.http, headers, created["stream_id"], within=10)
        assert sidecar.status == 404
        (_, body), *_ = sidecar.events
        assert body["id"] is None
        assert error(body, APP)["data"] == {"code": "video_stream_not_found", "status": 404}
        async with rpc_socket(server, headers) as socket:
            answer = await socket.call("video.subscribe", {"stream_id": created["stream_id"]})
            assert error(answer, APP)["data"]["code"] == "video_stream_not_found"
            await socket.quiet(0.2)
    # Nothing the others tried touched the job.
    job = result(await call(server.http, mine, "video.get", {"job_id": created["job_id"]}))
    assert job["status"] in ("queued", "running")
    missing = await read_sse(server.http, mine, "0" * 32, within=10)
    assert missing.status == 404
    no_session = await server.http.get("/api/rpc/events", headers=mine)
    assert no_session.status_code == 400
    assert error(no_session.json(), -32602)["data"]["param"] == "session"
    result(await call(server.http, mine, "video.cancel", {"job_id": created["job_id"]}))


async def test_the_socket_follows_several_jobs_at_once(server: Replica, minimax: Minimax) -> None:
    setup = await video_setup(server, minimax)
    headers = setup.tenant.key
    async with rpc_socket(server, headers) as socket:
        await socket.send(
            [
                {
                    "jsonrpc": "2.0",
                    "method": "video.create",
                    "params": {"model": setup.model, "prompt": f"[slow:{n}] job {n}"},
                    "id": n,
                }
                for n in (1, 3)
            ]
        )
        answers = await socket.answer()
        streams = [result(a)["stream_id"] for a in answers]
        assert len(set(streams)) == 2
        for stream_id in streams:
            notes = await socket.stream(stream_id)
            assert_forward_only(notes)
            assert notes[-1][0] == "video.done"
        # Unsubscribed streams stay quiet.
        job = await create_job(server.http, headers, setup.model, "[slow:3] unheard")
        result(await socket.call("video.subscribe", {"stream_id": job["stream_id"]}))
        await socket.next_note(job["stream_id"])
        unsubscribed = await socket.call("video.unsubscribe", {"stream_id": job["stream_id"]})
        assert result(unsubscribed) == {"stream_id": job["stream_id"], "watching": False}
        await wait_status(server.http, headers, job["id"], ("done",))
        await socket.quiet(0.3)
    after = socket.log[socket.log.index(unsubscribed) + 1 :]
    assert all(m.get("params", {}).get("stream_id") != job["stream_id"] for m in after), after
