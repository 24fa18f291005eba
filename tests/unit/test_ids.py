from __future__ import annotations

import time

from app.lib.ids import request_id, uuid7


def test_uuid7_layout_and_order() -> None:
    before = time.time_ns() // 1_000_000
    first = uuid7()
    after = time.time_ns() // 1_000_000
    assert first.version == 7
    assert first.variant == "specified in RFC 4122"
    assert before <= first.int >> 80 <= after
    ids = [uuid7() for _ in range(2000)]
    assert len(set(ids)) == 2000
    # Time-ordered to the millisecond: ids minted later never sort before earlier ones.
    stamps = [u.int >> 80 for u in ids]
    assert stamps == sorted(stamps)


def test_request_ids_are_32_hex_and_distinct() -> None:
    ids = {request_id() for _ in range(5000)}
    assert len(ids) == 5000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
