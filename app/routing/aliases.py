"""The alias table: ``alias -> target`` model names, resolved before routing."""

from __future__ import annotations

from collections.abc import Mapping


class AliasTable:
    """One hop only: an alias names a model, never another alias, so no cycles."""

    def __init__(self) -> None:
        self._targets: dict[str, str] = {}

    def replace_all(self, targets: Mapping[str, str]) -> None:
        self._targets = dict(targets)

    def set(self, alias: str, target: str) -> None:
        self._targets[alias] = target

    def remove(self, alias: str) -> bool:
        return self._targets.pop(alias, None) is not None

    def resolve(self, model: str) -> str:
        return self._targets.get(model, model)

    def items(self) -> list[tuple[str, str]]:
        return sorted(self._targets.items())

    def __contains__(self, alias: object) -> bool:
        return alias in self._targets
