"""Engine backends: the Celestia Engine Protocol (CEP, JSON-RPC 2.0 over WebSocket)."""

from app.routing.backends.engine.adapter import EngineBackend
from app.routing.backends.engine.streams import EngineChatStream

__all__ = ["EngineBackend", "EngineChatStream"]
