"""Price APIs.

- ``/api/admin/prices`` (platform admin): the platform's price book.
- ``/api/projects/{projectId}/prices`` (members read, owners and admins write): the
  project's own prices, the only ones its custom-LLM and override-key calls are
  priced with.

Both: ``GET /`` (paged), ``POST /``, ``GET /{priceId}``, ``PATCH /{priceId}`` and
``DELETE /{priceId}`` of a price not yet in force (409 ``price_in_force`` for one that
is: history is never rewritten). A change applies on every replica at once
(``PriceSync``), and a future price takes effect at its ``effectiveFrom`` by itself.
"""

from __future__ import annotations

from uuid import UUID

from litestar import delete, get, patch, post
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.domain.accounts.principals import Principal
from app.domain.paging import Page, Paging
from app.domain.prices.schemas import PriceIn, PriceOut, PriceUpdate
from app.domain.prices.services import ModelPriceService, price_out
from app.domain.projects.services import ProjectAccess
from app.domain.rest import AdminController, ProjectApiController


class PriceAdminController(AdminController):
    path = "/api/admin/prices"
    tags = ["admin: prices"]

    @get("/")
    async def list_prices(
        self, platform_admin: Principal, prices_service: ModelPriceService, paging: Paging
    ) -> Page[PriceOut]:
        rows, total = await prices_service.page_of(None, paging.limit, paging.offset)
        return paging.page(rows, total, price_out)

    @post("/", status_code=HTTP_201_CREATED)
    async def create_price(
        self, data: PriceIn, platform_admin: Principal, prices_service: ModelPriceService
    ) -> PriceOut:
        return price_out(await prices_service.add(None, data))

    @get("/{price_id:uuid}")
    async def get_price(
        self, price_id: UUID, platform_admin: Principal, prices_service: ModelPriceService
    ) -> PriceOut:
        return price_out(await prices_service.one(None, price_id))

    @patch("/{price_id:uuid}")
    async def update_price(
        self,
        price_id: UUID,
        data: PriceUpdate,
        platform_admin: Principal,
        prices_service: ModelPriceService,
    ) -> PriceOut:
        return price_out(await prices_service.change(None, price_id, data))

    @delete("/{price_id:uuid}", status_code=HTTP_204_NO_CONTENT)
    async def delete_price(
        self, price_id: UUID, platform_admin: Principal, prices_service: ModelPriceService
    ) -> None:
        await prices_service.remove(None, price_id)


class ProjectPriceController(ProjectApiController):
    path = "/api/projects/{project_id:uuid}/prices"

    @get("/")
    async def list_project_prices(
        self, access: ProjectAccess, prices_service: ModelPriceService, paging: Paging
    ) -> Page[PriceOut]:
        rows, total = await prices_service.page_of(access.project.id, paging.limit, paging.offset)
        return paging.page(rows, total, price_out)

    @post("/", status_code=HTTP_201_CREATED)
    async def create_project_price(
        self, access: ProjectAccess, data: PriceIn, prices_service: ModelPriceService
    ) -> PriceOut:
        access.require(access.can_manage_project, "set the project's prices")
        return price_out(await prices_service.add(access.project.id, data))

    @get("/{price_id:uuid}")
    async def get_project_price(
        self, access: ProjectAccess, price_id: UUID, prices_service: ModelPriceService
    ) -> PriceOut:
        return price_out(await prices_service.one(access.project.id, price_id))

    @patch("/{price_id:uuid}")
    async def update_project_price(
        self,
        access: ProjectAccess,
        price_id: UUID,
        data: PriceUpdate,
        prices_service: ModelPriceService,
    ) -> PriceOut:
        access.require(access.can_manage_project, "change the project's prices")
        return price_out(await prices_service.change(access.project.id, price_id, data))

    @delete("/{price_id:uuid}", status_code=HTTP_204_NO_CONTENT)
    async def delete_project_price(
        self, access: ProjectAccess, price_id: UUID, prices_service: ModelPriceService
    ) -> None:
        access.require(access.can_manage_project, "delete the project's prices")
        await prices_service.remove(access.project.id, price_id)
