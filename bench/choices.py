"""Comma-separated choices on the benchmarks' command lines."""

from __future__ import annotations

import argparse


def comma_choices(raw: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    """``raw`` split on commas, each one of ``allowed`` (an argparse error otherwise)."""
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown {what} {', '.join(unknown) or '(none given)'}; choose from "
            + ", ".join(allowed)
        )
    return names
