"""The Docker image, the compose stack and its load balancer, read as the tools would.

No Docker engine runs on the test machines, so these tests check the files against the
code they deploy: the command, port, routes, settings and drain time they rely on.
"""

from __future__ import annotations

import json
import secrets
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from app.cli import main as arona_cli
from app.cli.common import GRACEFUL_SHUTDOWN_SECONDS
from app.lib.http import NON_STREAM_DEADLINE_SECONDS, READ_TIMEOUT_SECONDS
from app.lib.settings import DEFAULT_MAX_BODY_BYTES, DEFAULT_PORT, SettingsError, load_settings
from app.lib.vault import generate_key_spec
from tests.support.infra import (
    COMPOSE,
    DOCKERFILE,
    DOCKERIGNORE,
    ENV_EXAMPLE,
    HEALTHCHECK_SCRIPT,
    NGINX_CONF,
    PLACEHOLDER,
    ROOT,
    Block,
    MissingVariableError,
    Stage,
    compose_variables,
    dockerfile_stages,
    dockerignore_allows,
    dockerignore_patterns,
    interpolate_tree,
    known_settings,
    load_yaml,
    nginx_bytes,
    nginx_seconds,
    parse_nginx,
    read_dotenv,
    split_flags,
)

REPLICAS = ("arona-1", "arona-2")
WEBSOCKET_PATHS = ("/ws/agent", "/api/rpc/ws")


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return dockerfile_stages(DOCKERFILE.read_text())


def _pinned(image: str) -> bool:
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest") and "$" not in image


# ---- Dockerfile ----


def test_dockerfile_is_multi_stage_on_pinned_bases(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    assert all(_pinned(stage.base) for stage in stages), [s.base for s in stages]
    build, runtime = stages[0], stages[-1]
    assert build.name == "build"
    copied_from = [split_flags(args)[0].get("from") for args in runtime.all("COPY")]
    assert "build" in copied_from
    # The final image holds no package manager for the project: uv stays in the build.
    assert not any("uv" in args.split() for args in runtime.all("RUN"))


def test_dependencies_come_from_the_lock_without_dev_tools(stages: list[Stage]) -> None:
    build = stages[0]
    syncs = [args for args in build.all("RUN") if "uv sync" in args]
    assert syncs
    for sync in syncs:
        assert "--frozen" in sync
        assert "--no-dev" in sync or "--no-default-groups" in sync
    first_copy = build.all("COPY")[0].split()
    assert "uv.lock" in first_copy
    assert "pyproject.toml" in first_copy
    installs = [args for args in build.all("RUN") if "pip install" in args]
    assert installs
    assert all("uv==" in args for args in installs), "uv must be pinned"
    assert "dev" in tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]


def test_final_stage_runs_as_a_numeric_non_root_user(stages: list[Stage]) -> None:
    runtime = stages[-1]
    users = runtime.all("USER")
    assert users
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit()
    assert int(uid) > 0
    assert not gid or (gid.isdigit() and int(gid) > 0)
    created = " ".join(runtime.all("RUN"))
    assert f"--uid {uid}" in created
    # Nothing after USER may run as root again.
    last_user = max(i for i, ins in enumerate(runtime.instructions) if ins.keyword == "USER")
    assert all(ins.keyword != "RUN" for ins in runtime.instructions[last_user:])


def test_image_serves_on_all_addresses_of_the_default_port(stages: list[Stage]) -> None:
    runtime = stages[-1]
    assert runtime.all("EXPOSE") == [str(DEFAULT_PORT)]
    env = " ".join(runtime.all("ENV"))
    # The settings default is 127.0.0.1, which nothing outside the container can reach.
    assert "ARONA_HOST=0.0.0.0" in env
    assert f"ARONA_PORT={DEFAULT_PORT}" in env


def test_entrypoint_is_arona_serve(stages: list[Stage]) -> None:
    runtime = stages[-1]
    command = json.loads(runtime.all("ENTRYPOINT")[-1]) + json.loads(runtime.all("CMD")[-1])
    assert command == ["arona", "serve"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["arona"] == "app.cli:main"
    assert {"serve", "migrate"} <= set(arona_cli.commands)


def test_healthcheck_probes_healthz_with_the_shipped_script(stages: list[Stage]) -> None:
    runtime = stages[-1]
    (healthcheck,) = runtime.all("HEALTHCHECK")
    options, _, command = healthcheck.partition(" CMD ")
    assert "--interval=" in options
    assert "--timeout=" in options
    assert json.loads(command) == ["arona-healthcheck", "/healthz"]
    copies = [split_flags(args) for args in runtime.all("COPY")]
    installed = {rest[-1]: (flags, rest[:-1]) for flags, rest in copies}
    flags, sources = installed["/usr/local/bin/arona-healthcheck"]
    assert sources == ["infra/docker/healthcheck.py"]
    assert flags.get("chmod") == "0755"
    assert HEALTHCHECK_SCRIPT.read_text().startswith("#!/usr/local/bin/python3\n")


def test_build_context_keeps_what_the_image_copies_and_nothing_private(
    stages: list[Stage],
) -> None:
    patterns = dockerignore_patterns(DOCKERIGNORE.read_text())
    sources = [
        source
        for stage in stages
        for flags, rest in (split_flags(args) for args in stage.all("COPY"))
        if "from" not in flags
        for source in rest[:-1]
    ]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert dockerignore_allows(patterns, source), f"{source} is excluded from the context"
    for private in (".venv", ".arona", ".tools", "tests", "config", "infra/.env", "arona.db"):
        assert not dockerignore_allows(patterns, private), private
    # The app resolves these next to app/ (app/db/config.py, app/server/app.py).
    assert {"app", "migrations", "static"} <= set(sources)


# ---- compose ----


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)  # type: ignore[no-any-return]


def filled_env() -> dict[str, str]:
    env = read_dotenv(ENV_EXAMPLE.read_text())
    env |= {
        "POSTGRES_PASSWORD": secrets.token_urlsafe(24),
        "ARONA_JWT_SECRET": secrets.token_urlsafe(48),
        "ARONA_VAULT_KEYS": generate_key_spec("k1"),
    }
    return env


def test_compose_has_the_whole_stack(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "migrate", *REPLICAS, "lb"}
    for name, service in services.items():
        assert _pinned(service["image"].replace("${ARONA_VERSION:-0.1.0}", "0.1.0")), name
        if name != "migrate":
            assert service["healthcheck"]["test"], name
    assert services["postgres"]["image"].startswith("postgres:")
    assert services["redis"]["image"].startswith("redis:")


def test_migrations_run_once_before_the_replicas(compose: dict[str, Any]) -> None:
    services = compose["services"]
    migrate = services["migrate"]
    assert migrate["command"] == ["migrate"]  # the image's entrypoint is `arona`
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in REPLICAS:
        replica = services[name]
        assert replica["command"] == ["serve"]
        assert replica["image"] == migrate["image"]
        assert replica["depends_on"] == {
            "migrate": {"condition": "service_completed_successfully"},
            "postgres": {"condition": "service_healthy"},
            "redis": {"condition": "service_healthy"},
        }
        assert replica["healthcheck"]["test"] == [
            "CMD",
            "arona-healthcheck",
            "/readyz?allow_degraded=true",
        ]
        assert nginx_seconds(replica["stop_grace_period"]) > GRACEFUL_SHUTDOWN_SECONDS
        assert "ports" not in replica, "replicas are reached through the load balancer"
        assert replica["read_only"] is True
        assert replica["cap_drop"] == ["ALL"]


def test_compose_builds_the_image_from_the_repository(compose: dict[str, Any]) -> None:
    build = compose["services"]["migrate"]["build"]
    context = (COMPOSE.parent / build["context"]).resolve()
    assert context == ROOT
    assert (context / build["dockerfile"]).resolve() == DOCKERFILE


def test_compose_environment_is_a_valid_arona_configuration(compose: dict[str, Any]) -> None:
    env = filled_env()
    stack = interpolate_tree(compose, env)
    services = stack["services"]
    arona_env = services["arona-1"]["environment"]
    assert set(arona_env) <= known_settings()
    settings = load_settings(arona_env)
    settings.validate()
    assert (settings.host, settings.port) == ("0.0.0.0", DEFAULT_PORT)
    assert settings.admin_token is None
    postgres = services["postgres"]["environment"]
    database = urlsplit(settings.database_url)
    assert database.scheme == "postgresql+asyncpg"
    assert (database.hostname, database.port) == ("postgres", 5432)
    assert database.username == postgres["POSTGRES_USER"]
    assert database.password == env["POSTGRES_PASSWORD"] == postgres["POSTGRES_PASSWORD"]
    assert database.path == "/" + postgres["POSTGRES_DB"]
    assert urlsplit(settings.redis_url or "").hostname == "redis"
    for name in ("migrate", "arona-2"):
        assert services[name]["environment"] == arona_env


def test_compose_refuses_to_start_without_the_secrets(compose: dict[str, Any]) -> None:
    env = filled_env()
    for required in ("POSTGRES_PASSWORD", "ARONA_JWT_SECRET", "ARONA_VAULT_KEYS"):
        missing = {k: v for k, v in env.items() if k != required}
        with pytest.raises(MissingVariableError, match=required):
            interpolate_tree(compose, missing)


def test_env_example_documents_every_variable_and_cannot_run_as_is() -> None:
    example = read_dotenv(ENV_EXAMPLE.read_text())
    assert compose_variables(COMPOSE.read_text()) <= set(example)
    for name in ("POSTGRES_PASSWORD", "ARONA_JWT_SECRET", "ARONA_VAULT_KEYS"):
        assert example[name] == PLACEHOLDER
    # An admin token placeholder left in place would be a working admin password.
    assert example["ARONA_ADMIN_TOKEN"] == ""
    stack = interpolate_tree(load_yaml(COMPOSE), example)
    with pytest.raises(SettingsError):
        load_settings(stack["services"]["arona-1"]["environment"]).validate()
    assert (ENV_EXAMPLE.parent / ".gitignore").read_text().splitlines()[-1] == ".env"


# ---- the load balancer ----


@pytest.fixture(scope="module")
def nginx() -> Block:
    return parse_nginx(NGINX_CONF.read_text())


def _effective(server: Block, location: Block, name: str) -> list[list[str]]:
    """nginx inherits a directive from the server block only when the location sets none
    of its own (proxy_set_header included)."""
    return location.values(name) or server.values(name)


def test_compose_mounts_the_nginx_config_as_the_default_server(compose: dict[str, Any]) -> None:
    lb = compose["services"]["lb"]
    name, _, tag = lb["image"].partition(":")
    assert name == "nginx", "the official nginx image"
    assert tag, "pinned by tag"
    (mount,) = lb["volumes"]
    source, target, mode = mount.split(":")
    assert (COMPOSE.parent / source).resolve() == NGINX_CONF
    assert (target, mode) == ("/etc/nginx/conf.d/default.conf", "ro")
    assert set(lb["depends_on"]) == set(REPLICAS)
    assert lb["ports"]


def test_nginx_balances_both_replicas(nginx: Block) -> None:
    (upstream,) = nginx.children("upstream")
    servers = {args[0] for args in upstream.values("server")}
    assert servers == {f"{name}:{DEFAULT_PORT}" for name in REPLICAS}
    # `resolve` follows a recreated replica's new address; it needs a zone and a resolver.
    assert all("resolve" in args for args in upstream.values("server"))
    assert upstream.value("zone")
    assert nginx.value("resolver")
    (server,) = nginx.children("server")
    locations = server.children("location")
    assert locations
    for location in locations:
        assert location.value("proxy_pass") == [f"http://{upstream.args[0]}"]


def test_nginx_passes_streams_unbuffered_and_long_enough(nginx: Block) -> None:
    (server,) = nginx.children("server")
    assert server.value("proxy_buffering") == ["off"]
    assert server.value("gzip") == ["off"]
    for location in server.children("location"):
        assert _effective(server, location, "proxy_buffering") == [["off"]]
        assert _effective(server, location, "proxy_http_version") == [["1.1"]]
        (read_timeout,) = _effective(server, location, "proxy_read_timeout")
        # Longer than Arona's own upstream deadline, so Arona answers the timeout.
        assert nginx_seconds(read_timeout[0]) > NON_STREAM_DEADLINE_SECONDS
        assert nginx_seconds(read_timeout[0]) > READ_TIMEOUT_SECONDS
    (body_limit,) = server.value("client_max_body_size") or []
    assert nginx_bytes(body_limit) >= DEFAULT_MAX_BODY_BYTES


def test_nginx_upgrades_websockets(nginx: Block) -> None:
    (upgrade_map,) = nginx.children("map")
    assert upgrade_map.args == ["$http_upgrade", "$connection_upgrade"]
    assert upgrade_map.value("default") == ["upgrade"]
    (server,) = nginx.children("server")
    by_path = {tuple(location.args): location for location in server.children("location")}
    for path in WEBSOCKET_PATHS:
        location = by_path[("=", path)]
        headers = {
            args[0].lower(): args[1] for args in _effective(server, location, "proxy_set_header")
        }
        assert headers["upgrade"] == "$http_upgrade"
        assert headers["connection"] == "$connection_upgrade"
        assert "host" in headers
        assert "x-forwarded-for" in headers
        (read_timeout,) = _effective(server, location, "proxy_read_timeout")
        assert nginx_seconds(read_timeout[0]) >= 3600


def test_proxied_paths_are_routes_of_the_app(tmp_path: Path) -> None:
    from app.server.app import create_app

    settings = load_settings(
        {
            "ARONA_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'routes.db'}",
            "ARONA_JWT_SECRET": secrets.token_urlsafe(48),
            "ARONA_VAULT_KEYS": generate_key_spec("k1"),
        }
    )
    paths = {route.path for route in create_app(settings).routes}
    assert {*WEBSOCKET_PATHS, "/healthz", "/readyz", "/metrics"} <= paths
