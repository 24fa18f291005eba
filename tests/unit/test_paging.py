"""The list envelope and row mappers shared by every paginated REST list, and the
member-removal rule shared by the Projects API and the console."""

from __future__ import annotations

import datetime
from types import SimpleNamespace
from uuid import UUID, uuid4

import msgspec
import pytest

from app.db.models import Project
from app.domain.bodies import Camel
from app.domain.paging import Paging, by_attributes, from_row, page_of
from app.domain.projects.services import ProjectAccess
from app.lib.errors import PermissionDeniedError


class ApiKeyOut(Camel):
    """The shape of the API key list before key governance: a plain row schema."""

    id: UUID
    name: str
    prefix: str
    created_at: datetime.datetime
    last_used_at: datetime.datetime | None
    revoked_at: datetime.datetime | None


def test_page_of_maps_rows_and_keeps_the_window() -> None:
    page = page_of([1, 2, 3], 10, 3, 6, str)
    assert msgspec.to_builtins(page) == {
        "items": ["1", "2", "3"],
        "total": 10,
        "limit": 3,
        "offset": 6,
    }


def test_paging_pages_rows_in_its_window() -> None:
    assert Paging(limit=3, offset=6).page([1, 2, 3], 10, str) == page_of([1, 2, 3], 10, 3, 6, str)


def test_from_row_reads_attributes_derives_and_takes_given_fields() -> None:
    now = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    row = SimpleNamespace(id=uuid4(), name="ci", prefix="ak_12", created_at=now)
    to_out = from_row(ApiKeyOut, last_used_at=lambda r: None, revoked_at=lambda r: r.created_at)
    assert to_out(row) == ApiKeyOut(
        id=row.id, name="ci", prefix="ak_12", created_at=now, last_used_at=None, revoked_at=now
    )
    # A given field wins over the row's attribute and over a derived one.
    assert to_out(row, name="given", revoked_at=None).name == "given"
    assert to_out(row, revoked_at=None).revoked_at is None


def test_by_attributes_reads_the_schema_fields_by_name() -> None:
    now = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    row = SimpleNamespace(
        id=uuid4(),
        name="ci",
        prefix="ak_12",
        created_at=now,
        last_used_at=None,
        revoked_at=now,
        key_hash="never shown",
    )
    out = by_attributes(ApiKeyOut)(row)
    assert out == ApiKeyOut(
        id=row.id,
        name="ci",
        prefix="ak_12",
        created_at=now,
        last_used_at=None,
        revoked_at=now,
    )
    assert "keyHash" not in msgspec.to_builtins(out)


def _access(role: str) -> ProjectAccess:
    return ProjectAccess(Project(id=uuid4(), name="p", slug="p", owner_id=uuid4()), role)  # type: ignore[arg-type]


def test_a_member_may_leave_but_not_remove_others() -> None:
    me, other = uuid4(), uuid4()
    _access("member").require_member_removal(me, me)
    with pytest.raises(PermissionDeniedError) as refused:
        _access("member").require_member_removal(me, other)
    assert refused.value.code == "insufficient_role"
    assert "your role (member) may not manage members" in str(refused.value)
    with pytest.raises(PermissionDeniedError):
        _access("api_key").require_member_removal(None, other)
    _access("owner").require_member_removal(me, other)
    _access("admin").require_member_removal(None, other)
