"""The video jobs page: recent jobs of every project, live, with an admin cancel.

Routes::

    GET  /admin/video                      the page
    GET  /admin/video/rows                 the table's rows (a fragment)
    POST /admin/video/{job_id}/cancel      cancel an active job, whoever owns it
    GET  /admin/stream/video               text/event-stream (``VideoFeed``, in ``pages``)

The admin cancel goes through ``VideoJobs.cancel`` as the job's own owner (the
owner is read from the job), so it is the very cancel the API performs: the same
conditional update, the usage record, and the ``video.failed`` ("cancelled")
notification to the job's clients. A job that finished meanwhile is refused (409)
and reported as a toast.
"""

from __future__ import annotations

import json

from litestar import get, post
from litestar.response import Redirect, Template
from litestar.status_codes import HTTP_303_SEE_OTHER

from app.domain.dashboard.common import AdminRequest, DashboardController, admin_page, fragment
from app.domain.dashboard.video_views import video_jobs_view
from app.domain.video.facade import VideoJobs, VideoOwner, job_not_found
from app.domain.video.views import parse_public_id
from app.domain.web.pages import WebUser

ROWS_TEMPLATE = "dashboard/partials/video_rows.html"


def _toast_on_body(message: str) -> dict[str, str]:
    """A success toast fired on <body>: by the time the answer arrives, the live feed
    may have replaced the button that was clicked (the job's cancel event travels
    faster), and an event fired on a detached button would reach nobody."""
    toast = {"level": "success", "message": message, "target": "body"}
    return {"HX-Trigger": json.dumps({"toast": toast})}


async def admin_cancel(jobs: VideoJobs, job_id: str) -> str:
    """Cancel any owner's active job; returns the model (for the toast). Raises the
    API's 404 ``video_job_not_found`` / 409 ``video_job_finished``."""
    parsed = parse_public_id(job_id)
    row = None if parsed is None else await jobs.store.get(parsed)
    if row is None:
        raise job_not_found(job_id)
    owner = VideoOwner(project_id=row.project_id, api_key_id=row.api_key_id, user_id=row.user_id)
    cancelled = await jobs.cancel(owner, job_id)
    return cancelled.model


class VideoPages(DashboardController):
    @get("/video")
    async def video_page(self, web_admin: WebUser, video_jobs: VideoJobs) -> Template:
        view = await video_jobs_view(video_jobs)
        return admin_page("dashboard/video.html", web_admin, "video", view=view)

    @get("/video/rows")
    async def video_rows(self, web_admin: WebUser, video_jobs: VideoJobs) -> Template:
        view = await video_jobs_view(video_jobs)
        return fragment(ROWS_TEMPLATE, web_admin, view=view)

    @post("/video/{job_id:str}/cancel", status_code=200)
    async def cancel_job(
        self, job_id: str, admin: AdminRequest, video_jobs: VideoJobs
    ) -> Template | Redirect:
        model = await admin_cancel(video_jobs, job_id)
        # Not ``admin.saved``: the rows are read only for htmx.
        if not admin.htmx:
            return Redirect("/admin/video", status_code=HTTP_303_SEE_OTHER)
        view = await video_jobs_view(video_jobs)
        message = f"Video job {job_id} ({model}) cancelled."
        return admin.fragment(ROWS_TEMPLATE, headers=_toast_on_body(message), view=view)
