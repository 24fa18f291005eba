"""Records copied into wider or narrower ones: a stored row into its API body, a
cached record into the one a call uses. Where the fields share their names they are
copied as one piece, by the target's field list, so a field added to both cannot be
forgotten in between; what differs is given by name."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import msgspec

R = TypeVar("R")


def _read_fields(record: type[Any]) -> tuple[tuple[str, bool], ...]:
    """Each field of a dataclass or msgspec struct type, and whether it is required.

    Cached per type: every metered call copies its record into a usage entry, and
    reading a struct's fields builds a description object per field each time."""
    if dataclasses.is_dataclass(record):
        missing = dataclasses.MISSING
        return tuple(
            (f.name, f.default is missing and f.default_factory is missing)
            for f in dataclasses.fields(record)
        )
    return tuple((f.name, f.required) for f in msgspec.structs.fields(record))


_fields = cast(Callable[[type[Any]], tuple[tuple[str, bool], ...]], functools.cache(_read_fields))


def field_names(record: type[Any]) -> tuple[str, ...]:
    """The fields of a dataclass or msgspec struct type."""
    return tuple(name for name, _ in _fields(record))


def field_values(record: type[Any], source: object, **given: Any) -> dict[str, Any]:
    """The values of the fields of ``record``: as in ``given``, else ``source``'s
    attribute of the same name; a field with a default that ``source`` has no
    attribute for (a new id, say) is left out, to take its default."""
    values = {
        name: getattr(source, name)
        for name, required in _fields(record)
        if name not in given and (required or hasattr(source, name))
    }
    return values | given


def copied(record: type[R], source: object, **given: Any) -> R:
    """A ``record`` with the fields in ``given`` as given and every other one read
    from ``source``'s attribute of the same name (see ``field_values``)."""
    return record(**field_values(record, source, **given))
