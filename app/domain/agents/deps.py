"""Dependency providers of the agents area (resolved by name by Litestar).

The per-app ``Agents`` bundle (hub, deployer, tokens) is exposed by
``wiring.py`` as ``agents``.
"""

from __future__ import annotations

from advanced_alchemy.extensions.litestar.providers import create_service_provider
from litestar.di import Provide

from app.domain.agents.services import AgentDeploymentService, AgentNodeService
from app.domain.service_provider import service_provider


def agents_dependencies() -> dict[str, Provide]:
    return {
        "agent_nodes_service": service_provider(AgentNodeService, bus="event_bus"),
        "agent_deployments_service": Provide(create_service_provider(AgentDeploymentService)),
    }
