"""The one call lifecycle: admission -> route -> relay -> meter.

Used by every surface that makes a metered call (``/v1`` chat and embeddings, the
runtime chat, video jobs, JSON-RPC); surfaces import it, never each other.

- ``callers``: who a ``/v1`` or JSON-RPC call is charged to (``Caller``).
- ``admission``: the project's path for the call (custom LLM, override key, quota).
- ``metering``: ``CallRecord`` -> one ``UsageEntry``; ``Meter`` records it.
- ``streaming``: the relayed stream's ending and its single settle.
"""
