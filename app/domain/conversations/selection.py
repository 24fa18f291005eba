"""Which profile a body names: ``modelProfileId`` or its aliases ``llmId`` / ``provider``.

Runtimes written against older docs send ``llmId`` or ``provider``; all three mean the
same thing. Several may be given with one value; two different values are a 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import msgspec

from app.domain.custom_llms.names import LLM_ID_PREFIX
from app.lib.errors import BadRequestError, NotFoundError
from app.routing.profiles import ProfileTable

# (wire name, value) in the order the error names them.
Named = tuple[tuple[str, "str | msgspec.UnsetType | None"], ...]


@dataclass(frozen=True, slots=True)
class ProfileChoice:
    given: bool
    """Whether the body named a profile at all (``null`` counts on a patch)."""
    profile_id: str | None
    param: str | None


NOT_GIVEN = ProfileChoice(given=False, profile_id=None, param=None)


class NamesProfile(Protocol):
    """A body with the three fields (conversation create, update and fork, the runtime
    chat); read-only here, so a body whose fields cannot be unset fits too."""

    @property
    def model_profile_id(self) -> str | msgspec.UnsetType | None: ...

    @property
    def llm_id(self) -> str | msgspec.UnsetType | None: ...

    @property
    def provider(self) -> str | msgspec.UnsetType | None: ...


def choose_profile(table: ProfileTable, body: NamesProfile, *, null_clears: bool) -> ProfileChoice:
    """The one profile the body's three fields name, checked against the profile table.

    With ``null_clears`` (patch) an explicit ``null`` is a value (clear the selection);
    otherwise (create, fork) ``null`` is the same as leaving the field out.
    """
    named: Named = (
        ("modelProfileId", body.model_profile_id),
        ("llmId", body.llm_id),
        ("provider", body.provider),
    )
    given = [
        (param, value)
        for param, value in named
        if value is not msgspec.UNSET and (null_clears or value is not None)
    ]
    if not given:
        return NOT_GIVEN
    param, value = given[0]
    for other_param, other_value in given[1:]:
        if other_value != value:
            raise BadRequestError(
                f"{param} and {other_param} name different profiles; send one of them",
                code="conflicting_profile_fields",
                param=other_param,
            )
    if value is None or isinstance(value, msgspec.UnsetType):
        return ProfileChoice(given=True, profile_id=None, param=param)
    if value.startswith(LLM_ID_PREFIX):
        # A project's custom LLM: checked against the project's own list at chat time
        # (the profile table does not hold them).
        return ProfileChoice(given=True, profile_id=value, param=param)
    profile = table.get(value)
    if profile is None:
        raise NotFoundError(
            f"no model profile {value!r} exists", code="profile_not_found", param=param
        )
    if not profile.enabled:
        raise BadRequestError(
            f"the model profile {value!r} is disabled", code="profile_disabled", param=param
        )
    return ProfileChoice(given=True, profile_id=value, param=param)
