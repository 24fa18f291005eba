"""The routing backend of each agent-deployed model.

Every model with a running deployment has one backend, named by ``backend_name``,
kind ``external``, at ``http://{agent host}:{port}``, advertising exactly the model
id. It always follows the model's *newest* running deployment (any agent): a
redeploy replaces it, a stop falls back to an older running deployment of the same
model elsewhere, and with none left the backend is removed. Writes go through
``BackendConfigService`` and ``RoutingConfigSync``, so every replica routes alike.

Naming rule: ``agent-`` + the model id. Backend names allow only letters, digits,
``.``, ``_`` and ``-`` (``NAME_PATTERN``) and 100 characters; when the model id has
other characters (``org/model``) or is too long, each disallowed character becomes
``-``, the result is cut to fit, and ``-`` plus the first 8 hex digits of the model
id's SHA-256 is appended, so ``org/model`` and ``org-model`` never share a backend.
"""

from __future__ import annotations

import hashlib
import re

import structlog
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.domain.agents.services import AgentDeploymentService
from app.domain.backends.schemas import AGENT_PREFIX, ValidRegistration, check_backend_url
from app.domain.backends.services import BackendConfigService, stored_as
from app.domain.backends.sync import RoutingConfigSync
from app.lib.vault import Vault

PREFIX = AGENT_PREFIX
MAX_NAME = 100
_DISALLOWED = re.compile(r"[^A-Za-z0-9._-]")
_HASH_LENGTH = 8
logger = structlog.get_logger()


def backend_name(model_id: str) -> str:
    name = PREFIX + model_id
    if len(name) <= MAX_NAME and not _DISALLOWED.search(model_id):
        return name
    digest = hashlib.sha256(model_id.encode()).hexdigest()[:_HASH_LENGTH]
    cleaned = _DISALLOWED.sub("-", model_id)[: MAX_NAME - len(PREFIX) - _HASH_LENGTH - 1]
    return f"{PREFIX}{cleaned}-{digest}"


def backend_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


class AgentBackends:
    def __init__(
        self, *, db_config: SQLAlchemyAsyncConfig, vault: Vault, routing_sync: RoutingConfigSync
    ) -> None:
        self._db_config = db_config
        self._vault = vault
        self._routing_sync = routing_sync

    async def sync(self, model_id: str) -> None:
        """Make ``model_id``'s backend match its newest running deployment (or drop it)."""
        name = backend_name(model_id)
        async with AgentDeploymentService.new(config=self._db_config) as deployments:
            serving = await deployments.serving(model_id)
        async with BackendConfigService.new(config=self._db_config) as backends:
            current = await backends.get_by_name(name)
            if serving is None:
                if current is None:
                    return
                await backends.delete(current.id, auto_commit=True)
            else:
                deployment, agent = serving
                if agent.host is None or deployment.port is None:
                    return
                registration = ValidRegistration(
                    name=name,
                    kind="external",
                    url=check_backend_url(backend_url(agent.host, deployment.port)),
                    api_key=None,
                    models=(model_id,),
                )
                if current is not None and stored_as(current, registration, self._vault):
                    return
                await backends.register(registration, self._vault)
        await self._routing_sync.backend_changed(name)
        logger.info(
            "agent backend updated",
            backend=name,
            model=model_id,
            removed=serving is None,
        )
