"""Every setting is documented, and the documented upstream limits are the real defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.lib.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_SOURCE = (ROOT / "app" / "lib" / "settings.py").read_text()
README = (ROOT / "README.md").read_text()
DEPLOYMENT = (ROOT / "docs" / "deployment.md").read_text()

UPSTREAM_LIMITS = {
    "ARONA_UPSTREAM_MAX_BODY_BYTES": "upstream_max_body_bytes",
    "ARONA_UPSTREAM_MAX_EVENT_BYTES": "upstream_max_event_bytes",
    "ARONA_UPSTREAM_MAX_LISTING_BYTES": "upstream_max_listing_bytes",
    "ARONA_UPSTREAM_MAX_ERROR_BYTES": "upstream_max_error_bytes",
    "ARONA_UPSTREAM_TIMEOUT_SECONDS": "upstream_timeout_seconds",
    "ARONA_UPSTREAM_READ_TIMEOUT_SECONDS": "upstream_read_timeout_seconds",
    "ARONA_UPSTREAM_STREAM_IDLE_TIMEOUT_SECONDS": "upstream_stream_idle_timeout_seconds",
    "ARONA_UPSTREAM_CONNECT_TIMEOUT_SECONDS": "upstream_connect_timeout_seconds",
}


def test_every_variable_the_settings_read_is_in_the_readme() -> None:
    names = set(re.findall(r'"(ARONA_[A-Z0-9_]+)"', SETTINGS_SOURCE))
    assert names >= set(UPSTREAM_LIMITS)
    missing = sorted(name for name in names if f"| `{name}` |" not in README)
    assert not missing, f"settings without a README row: {missing}"


@pytest.mark.parametrize(("variable", "field"), sorted(UPSTREAM_LIMITS.items()))
def test_the_deployment_guide_lists_each_upstream_limit_with_its_default(
    variable: str, field: str
) -> None:
    row = next((line for line in DEPLOYMENT.splitlines() if f"| `{variable}` |" in line), None)
    assert row is not None, f"{variable} is not in docs/deployment.md"
    default = getattr(Settings(), field)
    shown = row.split("|")[2].strip().split(" ")[0]
    assert float(shown) == float(default), (variable, shown, default)
