"""Model profiles as routing sees them: which model, on which tagged backends, with
which fallbacks. The domain layer loads them from the database and keeps this table
current on every replica; routing only reads it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from app.routing.types import ScoreKind


@dataclass(frozen=True, slots=True)
class Profile:
    id: str
    name: str
    base_model: str
    tags: frozenset[str] = frozenset()
    supports_tools: bool = False
    supports_images: bool = False
    context_window_tokens: int = 8192
    max_output_tokens: int = 2048
    enabled: bool = True
    fallback_profile_id: str | None = None
    """Where a conversation goes after a stream of this profile dropped (sticky)."""
    slow_threshold_ms: int | None = None
    """Time to first token above which latency failover redirects new requests."""
    failover_chain: tuple[str, ...] = ()
    """Profiles tried in order while this one is slow."""
    routing_score: ScoreKind | None = None
    """How the router ranks backends for this profile's calls; None: its default."""


class ProfileTable:
    """Every profile by id. ``version`` changes on every change, so caches derived
    from the table (the runtime catalog) can tell they are stale."""

    def __init__(self, profiles: Iterable[Profile] = ()) -> None:
        self._profiles: dict[str, Profile] = {p.id: p for p in profiles}
        self.version = 0

    def replace_all(self, profiles: Iterable[Profile]) -> None:
        fresh = {p.id: p for p in profiles}
        if fresh != self._profiles:
            self._profiles = fresh
            self.version += 1

    def put(self, profile: Profile) -> None:
        if self._profiles.get(profile.id) != profile:
            self._profiles[profile.id] = profile
            self.version += 1

    def remove(self, profile_id: str) -> None:
        if self._profiles.pop(profile_id, None) is not None:
            self.version += 1

    def get(self, profile_id: str) -> Profile | None:
        return self._profiles.get(profile_id)

    def __iter__(self) -> Iterator[Profile]:
        """Sorted by id: the catalog order, and the default when a project sets none."""
        return iter(sorted(self._profiles.values(), key=lambda p: p.id))

    def __len__(self) -> int:
        return len(self._profiles)
