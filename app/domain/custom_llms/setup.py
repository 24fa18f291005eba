"""The per-process objects of the custom LLMs area, built once by ``build_resources``.

``resources.custom_llms`` (DI name ``custom_llms``) bundles them:

- ``directory``: ``CustomLlmDirectory``, the routing side's view (``directory.py``);
- ``http``: the SSRF-guarded upstream pool every custom LLM call goes through;
- ``guard``: the write-time URL check under the same policy;
- ``sync``: invalidation over the ``EventBus`` (``sync.py``); the lifespan runs
  ``sync.run`` and, as a safety net, ``sync.reload`` periodically, and closes ``http``.

The catalog shows each project's enabled custom LLMs after its profiles: building
the bundle attaches the directory to the ``ProfileCatalog`` as its extra source.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from uuid import UUID

from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.db.outage import unavailable_on_outage
from app.domain.custom_llms.directory import CustomLlmDirectory
from app.domain.custom_llms.probe import probe_custom_llm
from app.domain.custom_llms.schemas import CustomLlmTestOut
from app.domain.custom_llms.services import CustomLlmService
from app.domain.custom_llms.stored import load_project_llms, open_key, stored_llm
from app.domain.custom_llms.sync import CustomLlmSync
from app.domain.profiles.catalog import ProfileCatalog
from app.domain.profiles.schemas import LlmOut
from app.domain.secrets.services import SecretResolver
from app.lib.events.base import EventBus
from app.lib.http import GuardedUpstreamHttp, UpstreamLimits, build_guarded_http_client
from app.lib.settings import Settings
from app.lib.ssrf import SsrfPolicy, UrlGuard
from app.lib.vault import Vault

_NOT_CACHED = (
    "the database is unreachable and this project's custom LLMs are not cached on this "
    "server; retry shortly"
)


@dataclass(frozen=True, slots=True)
class CustomLlms:
    directory: CustomLlmDirectory
    sync: CustomLlmSync
    http: GuardedUpstreamHttp
    guard: UrlGuard

    async def test(
        self, service: CustomLlmService, project_id: UUID, name: str
    ) -> CustomLlmTestOut:
        """One real call to the project's custom LLM ``name`` (the console and the
        REST API both test through here)."""
        llm = stored_llm(await service.require(project_id, name))
        # End the read transaction: no pooled connection is held during the call.
        await service.repository.session.commit()
        target = await self.directory.open(llm)
        return await probe_custom_llm(self.http, target)

    async def close(self) -> None:
        await self.http.aclose()


def ssrf_policy(settings: Settings) -> SsrfPolicy:
    """``ARONA_CUSTOM_LLM_ALLOW_PRIVATE``, implied by ``arona demo`` (its upstreams are
    loopback fakes, and it serves only the machine it runs on by default)."""
    return SsrfPolicy(allow_private=settings.custom_llm_allow_private or settings.demo)


async def catalog_entries(directory: CustomLlmDirectory, project_id: UUID) -> list[LlmOut]:
    """The project's enabled custom LLMs as runtime catalog entries.

    ``contextWindowTokens`` is ``maxInputTokens + maxOutputTokens`` (input and output
    share the window); tools and images are not advertised (nothing says the
    endpoint supports them); no tags.
    """
    return [
        LlmOut(
            id=entry.llm_id,
            name=entry.name,
            enabled=True,
            supports_tools=False,
            supports_images=False,
            context_window_tokens=entry.context_window_tokens,
            max_output_tokens=entry.max_output_tokens,
            tags=[],
        )
        for entry in await directory.listing(project_id)
    ]


def build_custom_llms(
    settings: Settings,
    db_config: SQLAlchemyAsyncConfig,
    vault: Vault,
    bus: EventBus,
    catalog: ProfileCatalog,
) -> CustomLlms:
    policy = ssrf_policy(settings)
    directory = CustomLlmDirectory(
        unavailable_on_outage(partial(load_project_llms, db_config), _NOT_CACHED),
        reveal=unavailable_on_outage(SecretResolver(db_config, vault).reveal, _NOT_CACHED),
        open_key=partial(open_key, vault),
    )
    catalog.attach_source(partial(catalog_entries, directory))
    return CustomLlms(
        directory=directory,
        sync=CustomLlmSync(directory, catalog, bus),
        http=build_guarded_http_client(
            policy,
            connect_timeout=settings.upstream_connect_timeout_seconds,
            read_timeout=settings.upstream_read_timeout_seconds,
            limits=UpstreamLimits.of(settings),
        ),
        guard=UrlGuard(policy),
    )
