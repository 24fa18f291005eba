"""JSON-RPC 2.0 over HTTP, WebSocket and an SSE sidecar: the video jobs API with
live notifications.

Transports (all take the ``/v1`` credentials, ``Authorization: Bearer`` with a
project API key or a user access token):

- ``POST /api/rpc``: one request, one notification or a batch per body; the answer
  is JSON (``application/json``), status 200 whatever the JSON-RPC outcome, 204 with
  no body when nothing needs an answer (notifications only). Transport failures keep
  an HTTP status and still carry a JSON-RPC error object with ``id: null``: 401/403
  (credentials), 405 (not POST), 413 (body over the app's limit).
- ``GET /api/rpc/ws``: the same messages over text frames, plus server-pushed
  notifications (``video.progress``, ``video.done``, ``video.failed``) for the jobs
  created on the socket and the streams subscribed with ``video.subscribe``. A refused
  handshake is an HTTP 401/403 with the JSON-RPC error body (``websocket.http.response``;
  a 1008 close where the server lacks it).
- ``GET /api/rpc/events?session=<stream_id>``: ``text/event-stream`` of one job's
  notifications (``event: video.progress`` + ``data: {params}``), see ``sidecar``.

Error codes (``protocol``): the standard -32700 (body is not JSON), -32600 (not a
valid request object, empty or oversized batch, message over the size limit), -32601
(unknown method, or a method this transport does not offer), -32602 (params do not
fit the method, with ``data.param`` naming the field), -32603 (a bug; logged once).
Errors of the application (``AronaError``) keep their message and carry
``data: {"code", "status", "param"?, "retry_after"?}`` (the REST API's code and HTTP
status); a 400 (bad input: blank prompt, bad image, a chat-only model) is -32602,
every other status is -32000. ``data.code`` is the stable thing to switch on.
"""
