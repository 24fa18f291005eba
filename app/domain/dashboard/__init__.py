"""The platform admins' dashboard (``/admin``): HTML pages over the admin services,
with the live parts (backend health and load, latency failover) streamed over SSE
from the EventBus, so a page shows what any replica detected."""
