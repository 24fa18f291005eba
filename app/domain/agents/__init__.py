"""GPU agents: identities, the authenticated ``/ws/agent`` socket, deployments."""
