"""Admin API for the shared routing pool: ``/api/admin/backends`` and ``/api/admin/aliases``.

Every write goes to the database first, then to this replica's registry at once, then
to the other replicas through ``RoutingConfigSync``. Stored API keys are write-only:
responses say whether a key is set (``has_api_key``), never what it is.
"""

from __future__ import annotations

import datetime

from litestar import delete, get, post
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED, HTTP_204_NO_CONTENT

from app.db.models import BackendConfig
from app.domain.accounts.principals import Principal
from app.domain.backends.schemas import (
    AliasIn,
    AliasOut,
    BackendOut,
    BackendRegistration,
    BreakerOut,
    HealthOut,
    validate_alias,
    validate_registration,
)
from app.domain.backends.services import AliasService, BackendConfigService
from app.domain.backends.sync import RoutingConfigSync
from app.domain.paging import Page, Paging, by_attributes
from app.domain.rest import AdminController
from app.lib.errors import ERRORS_OPT
from app.lib.vault import Vault
from app.routing.health import HealthChecker
from app.routing.registry import BackendRegistry, BackendState
from app.routing.types import monotonic

# Stored but absent from the registry: its key could not be decrypted or no adapter
# could be built for it (the server log says which).
NOT_LOADED = HealthOut(status="unknown", reason="not loaded on this replica", checked_at=None)


def _epoch_to_utc(value: float | None) -> datetime.datetime | None:
    return None if value is None else datetime.datetime.fromtimestamp(value, datetime.UTC)


def backend_out(row: BackendConfig, state: BackendState | None) -> BackendOut:
    if state is None:
        health, breaker, advertised, in_flight = NOT_LOADED, BreakerOut("closed", 0), [], 0
    else:
        health = HealthOut(
            status=state.health.status.value,
            reason=state.health.reason,
            checked_at=_epoch_to_utc(state.health.checked_at),
        )
        cooling_until = state.cooldown_until
        breaker = BreakerOut(
            state=state.breaker.state.value,
            consecutive_failures=state.breaker.consecutive_failures,
            open_seconds_left=round(state.breaker.open_remaining(), 3),
            # The router's clock (monotonic) set cooldown_until.
            cooling_seconds_left=0.0
            if cooling_until is None
            else round(max(0.0, cooling_until - monotonic()), 3),
        )
        advertised, in_flight = list(state.models), state.in_flight
    resolved = None
    if state is not None and state.spec.configured_url is not None:
        resolved = state.spec.url
    return BackendOut(
        name=row.name,
        type=row.kind,
        url=row.url,
        resolved_url=resolved,
        has_api_key=row.api_key_encrypted is not None,
        models=list(row.models),
        tags=list(row.tags or ()),
        max_concurrency=row.max_concurrency,
        advertised_models=advertised,
        health=health,
        breaker=breaker,
        in_flight=in_flight,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


alias_out = by_attributes(AliasOut)


class BackendAdminController(AdminController):
    path = "/api/admin/backends"
    tags = ["admin: backends"]

    @post("/", status_code=HTTP_201_CREATED, opt={ERRORS_OPT: (502,)})
    async def register_backend(
        self,
        data: BackendRegistration,
        platform_admin: Principal,
        backend_configs_service: BackendConfigService,
        vault: Vault,
        routing_sync: RoutingConfigSync,
        health_checker: HealthChecker,
        backend_registry: BackendRegistry,
    ) -> BackendOut:
        """Register a backend, or replace the one of that name. It is probed at once
        (in the background: the answer shows the health it had), also when the body
        repeats what is stored."""
        registration = validate_registration(data)
        await routing_sync.verify_url(registration.url)
        before = backend_registry.get(registration.name)
        row = await backend_configs_service.register(registration, vault)
        return backend_out(row, routing_sync.probe_if_kept(row.name, before, health_checker))

    @get("/")
    async def list_backends(
        self,
        platform_admin: Principal,
        backend_configs_service: BackendConfigService,
        backend_registry: BackendRegistry,
        paging: Paging,
    ) -> Page[BackendOut]:
        rows, total = await backend_configs_service.page(paging.limit, paging.offset)
        return paging.page(
            rows, total, lambda row: backend_out(row, backend_registry.get(row.name))
        )

    @get("/{name:str}")
    async def get_backend(
        self,
        name: str,
        platform_admin: Principal,
        backend_configs_service: BackendConfigService,
        backend_registry: BackendRegistry,
    ) -> BackendOut:
        row = await backend_configs_service.require(name)
        return backend_out(row, backend_registry.get(row.name))

    @post("/{name:str}/probe", status_code=HTTP_200_OK)
    async def probe_backend(
        self,
        name: str,
        platform_admin: Principal,
        backend_configs_service: BackendConfigService,
        backend_registry: BackendRegistry,
        routing_sync: RoutingConfigSync,
        health_checker: HealthChecker,
    ) -> BackendOut:
        """Probe the backend now and answer with it, its fresh health included; every
        replica applies the result. A stored backend this replica has not loaded (its
        key cannot be decrypted, its evernight tunnel is down) is loaded again first;
        if it still cannot be, it is shown as not loaded and nothing is probed."""
        row = await backend_configs_service.require(name)
        # End the read transaction: no pooled connection is held during the probe.
        await backend_configs_service.repository.session.commit()
        state = backend_registry.get(name)
        if state is None:
            await routing_sync.reload_backend(name)
            state = backend_registry.get(name)
        if state is not None:
            await health_checker.probe(state, share=True)
        return backend_out(row, backend_registry.get(name))

    @delete("/{name:str}", status_code=HTTP_204_NO_CONTENT)
    async def delete_backend(
        self,
        name: str,
        platform_admin: Principal,
        backend_configs_service: BackendConfigService,
    ) -> None:
        await backend_configs_service.delete_by_name(name)


class AliasAdminController(AdminController):
    path = "/api/admin/aliases"
    tags = ["admin: aliases"]

    @post("/", status_code=HTTP_201_CREATED)
    async def set_alias(
        self,
        data: AliasIn,
        platform_admin: Principal,
        aliases_service: AliasService,
    ) -> AliasOut:
        alias, target = validate_alias(data)
        row = await aliases_service.set_alias(alias, target)
        return alias_out(row)

    @get("/")
    async def list_aliases(
        self,
        platform_admin: Principal,
        aliases_service: AliasService,
        paging: Paging,
    ) -> Page[AliasOut]:
        rows, total = await aliases_service.page(paging.limit, paging.offset)
        return paging.page(rows, total, alias_out)

    # A path parameter: aliases often look like Hugging Face ids (``org/model``).
    @delete("/{alias:path}", status_code=HTTP_204_NO_CONTENT)
    async def delete_alias(
        self,
        alias: str,
        platform_admin: Principal,
        aliases_service: AliasService,
    ) -> None:
        await aliases_service.delete_by_alias(alias.removeprefix("/"))
