"""Give freed heap memory back to the operating system after large reads.

A large upstream answer is read in many chunks of tens to hundreds of kilobytes. Once
they are freed, glibc's allocator keeps the pages: the chunks sit between small
long-lived objects, and after the first large free its dynamic mmap threshold rises,
so later chunks land on the heap too. A replica that read a few 30 MB answers at
once would keep their size for good. ``malloc_trim(0)`` returns every free page of
the heap (glibc releases whole free pages inside the heap, not only at its top).

Trims are cheap but not free (they walk the heap), so they are debounced: at most
one per ``interval`` seconds, run a moment after the large read that asked for it,
when its buffers are gone. On a C library without ``malloc_trim`` this does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable

DEFAULT_DELAY_SECONDS = 0.5
"""Long enough for the request that read the large body to have let go of it."""
LARGE_READ_BYTES = 4 * 1024 * 1024
"""Reads at least this large (kept or refused) ask for a trim."""


def _malloc_trim() -> Callable[[], None] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc (musl, macOS): nothing to trim this way
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def run() -> None:
        trim(0)

    return run


class HeapTrimmer:
    """``request()`` after a large read; the trim runs once, shortly after."""

    __slots__ = ("_delay", "_handle", "_trim", "trims")

    def __init__(
        self,
        *,
        delay: float = DEFAULT_DELAY_SECONDS,
        trim: Callable[[], None] | None = None,
    ) -> None:
        self._delay = delay
        self._trim = trim if trim is not None else _malloc_trim()
        self._handle: asyncio.TimerHandle | None = None
        self.trims = 0
        """How many trims ran (tests and diagnostics)."""

    def request(self) -> None:
        if self._trim is None or self._handle is not None:
            return  # nothing to call, or one is already on its way
        self._handle = asyncio.get_running_loop().call_later(self._delay, self._run)

    def _run(self) -> None:
        self._handle = None
        if self._trim is not None:
            self._trim()
            self.trims += 1

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
