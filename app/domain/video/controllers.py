"""Video generation over REST.

- ``/v1/video/generations`` (project API key or user token, like the rest of ``/v1``):
  ``POST`` creates a job and answers 200 (OpenAI answers creations with 200) with the
  job as ``GET`` shows it, ``status: "queued"``; ``GET /{id}`` reads one; ``GET``
  lists the caller's jobs newest first as an OpenAI list object with ``total``,
  ``limit`` (1-100, default 20), ``offset`` and ``has_more``; ``POST /{id}/cancel``
  cancels (409 ``video_job_finished`` once it is done, failed or cancelled).
  Another project's (or user's) job is a 404 ``video_job_not_found``.
- ``/api/admin/video-prices`` (platform admins, camelCase): ``PUT /{model}`` sets a
  model's price, ``GET`` lists them (``{"items", "total", "limit", "offset"}``),
  ``GET``/``DELETE /{model}``.
"""

from __future__ import annotations

from typing import Annotated

from litestar import Controller, delete, get, post, put
from litestar.params import QueryParameter
from litestar.status_codes import HTTP_200_OK, HTTP_204_NO_CONTENT

from app.domain.accounts.principals import Principal
from app.domain.calls.callers import Caller
from app.domain.paging import OffsetQuery, Page, Paging
from app.domain.rest import AdminController
from app.domain.video.facade import DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT, VideoJobs, VideoOwner
from app.domain.video.prices import VideoPrices
from app.domain.video.schemas import (
    VideoJobList,
    VideoJobOut,
    VideoJobRequest,
    VideoPriceIn,
    VideoPriceOut,
)
from app.lib.errors import ERRORS_OPT

# A 10 MiB first-frame image is ~13.4 MiB of base64: this route takes more than the
# API's general body cap.
MAX_CREATE_BODY_BYTES = 15 * 1024 * 1024
JobLimitQuery = Annotated[int, QueryParameter(name="limit", ge=1, le=MAX_LIST_LIMIT)]


class VideoGenerationController(Controller):
    path = "/v1/video/generations"
    tags = ["gateway: video"]

    @post(
        "/",
        status_code=HTTP_200_OK,
        request_max_body_size=MAX_CREATE_BODY_BYTES,
        opt={ERRORS_OPT: (404, 429)},
    )
    async def create_generation(
        self, data: VideoJobRequest, caller: Caller, video_jobs: VideoJobs
    ) -> VideoJobOut:
        return await video_jobs.create(VideoOwner.of(caller), data)

    @get("/")
    async def list_generations(
        self,
        caller: Caller,
        video_jobs: VideoJobs,
        limit: JobLimitQuery = DEFAULT_LIST_LIMIT,
        offset: OffsetQuery = 0,
    ) -> VideoJobList:
        jobs, total = await video_jobs.list(VideoOwner.of(caller), limit=limit, offset=offset)
        return VideoJobList(
            data=jobs,
            total=total,
            limit=limit,
            offset=offset,
            has_more=offset + len(jobs) < total,
        )

    @get("/{job_id:str}")
    async def get_generation(
        self, job_id: str, caller: Caller, video_jobs: VideoJobs
    ) -> VideoJobOut:
        return await video_jobs.get(VideoOwner.of(caller), job_id)

    @post("/{job_id:str}/cancel", status_code=HTTP_200_OK)
    async def cancel_generation(
        self, job_id: str, caller: Caller, video_jobs: VideoJobs
    ) -> VideoJobOut:
        return await video_jobs.cancel(VideoOwner.of(caller), job_id)


class VideoPriceAdminController(AdminController):
    path = "/api/admin/video-prices"
    tags = ["admin: video prices"]

    @get("/")
    async def list_prices(
        self,
        platform_admin: Principal,
        video_prices: VideoPrices,
        paging: Paging,
    ) -> Page[VideoPriceOut]:
        items, total = await video_prices.page(paging.limit, paging.offset)
        return Page(items=items, total=total, limit=paging.limit, offset=paging.offset)

    @put("/{model:str}")
    async def put_price(
        self, model: str, data: VideoPriceIn, platform_admin: Principal, video_prices: VideoPrices
    ) -> VideoPriceOut:
        return await video_prices.put(model, data)

    @get("/{model:str}")
    async def get_price(
        self, model: str, platform_admin: Principal, video_prices: VideoPrices
    ) -> VideoPriceOut:
        return await video_prices.get(model)

    @delete("/{model:str}", status_code=HTTP_204_NO_CONTENT)
    async def delete_price(
        self, model: str, platform_admin: Principal, video_prices: VideoPrices
    ) -> None:
        await video_prices.delete(model)
