"""A job row as the API shows it, and the public job id."""

from __future__ import annotations

import datetime
from uuid import UUID

from app.db.models import VideoJob
from app.domain.video.schemas import OBJECT, VideoError, VideoJobOut, VideoResult

ID_PREFIX = "vid_"


def public_id(job_id: UUID) -> str:
    return f"{ID_PREFIX}{job_id.hex}"


def parse_public_id(value: str) -> UUID | None:
    """The job UUID of ``vid_<hex>`` (a bare UUID is accepted too); None if malformed."""
    raw = value.removeprefix(ID_PREFIX)
    if len(raw) not in (32, 36):
        return None
    try:
        return UUID(raw)
    except ValueError:
        return None


def unix(moment: datetime.datetime | None) -> int:
    return 0 if moment is None else int(moment.timestamp())


def job_out(row: VideoJob) -> VideoJobOut:
    error = None
    if row.status in ("failed", "cancelled"):
        error = VideoError(message=row.error or row.status, code=row.error_code)
    return VideoJobOut(
        id=public_id(row.id),
        object=OBJECT,
        model=row.model,
        status=row.status,
        progress=row.progress,
        stream_id=row.stream_id,
        created_at=unix(row.created_at),
        updated_at=unix(row.updated_at),
        result=VideoResult(url=row.result_url) if row.result_url else None,
        error=error,
        cost=row.cost,
    )
