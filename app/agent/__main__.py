"""``arona agent`` / ``python -m app.agent``: the reference GPU agent.

    python -m app.agent --panel http://panel:8420 --token agt-... \\
        [--command "vllm serve {model} --port {port}"] [--advertise-host HOST] \\
        [--heartbeat-interval 10] [--ready-timeout 600] [--stop-grace 10]

It exits 0 on SIGINT/SIGTERM (stopping every model server it started first) and 2
when the panel refuses its token.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from pathlib import Path

import structlog

from app import __version__
from app.agent.client import AgentClient, AgentOptions, TokenRefusedError, socket_url
from app.agent.processes import ModelProcesses
from app.agent.telemetry import read_gpus
from app.lib.tasks import wait_for_stop_signal

DEFAULT_COMMAND = "vllm serve {model} --port {port}"
logger = structlog.get_logger()


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="arona agent", description="Connect this machine's GPUs to an Arona panel."
    )
    parser.add_argument("--panel", required=True, help="the panel's URL, e.g. http://panel:8420")
    token = parser.add_mutually_exclusive_group(required=True)
    token.add_argument("--token", help="the agent token shown when the agent was created")
    token.add_argument("--token-file", type=Path, help="read the token from this file")
    parser.add_argument(
        "--command",
        default=DEFAULT_COMMAND,
        help="model server command; {model} and {port} are substituted (default: %(default)s)",
    )
    parser.add_argument(
        "--advertise-host",
        default=None,
        help="host the panel routes to (default: this side's address of the panel socket)",
    )
    parser.add_argument("--name", default=socket.gethostname(), help="machine name shown")
    parser.add_argument("--heartbeat-interval", type=_positive, default=10.0, metavar="SECONDS")
    parser.add_argument(
        "--ready-timeout",
        type=_positive,
        default=600.0,
        metavar="SECONDS",
        help="how long a started server may take to answer /v1/models",
    )
    parser.add_argument(
        "--stop-grace",
        type=_positive,
        default=10.0,
        metavar="SECONDS",
        help="SIGTERM, then SIGKILL after this long",
    )
    args = parser.parse_args(argv)
    try:
        socket_url(args.panel)
    except ValueError as exc:
        parser.error(str(exc))
    if args.token_file is not None:
        try:
            args.token = args.token_file.read_text().strip()
        except OSError as exc:
            parser.error(f"cannot read --token-file: {exc}")
    if not args.token:
        parser.error("the token is empty")
    return args


async def run(args: argparse.Namespace) -> int:
    processes = ModelProcesses(
        args.command, ready_timeout=args.ready_timeout, stop_grace=args.stop_grace
    )
    client = AgentClient(
        AgentOptions(
            panel=args.panel,
            token=args.token,
            machine_name=args.name[:200],
            version=__version__,
            advertise_host=args.advertise_host,
            heartbeat_seconds=args.heartbeat_interval,
        ),
        processes,
        gpus=read_gpus,
    )
    connection = asyncio.create_task(client.run())
    stopping = asyncio.create_task(wait_for_stop_signal())
    try:
        await asyncio.wait({connection, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        connection.cancel()
        stopping.cancel()
        await asyncio.gather(connection, stopping, return_exceptions=True)
        await client.close()
    if connection.done() and not connection.cancelled():
        error = connection.exception()
        if isinstance(error, TokenRefusedError):
            print(f"arona agent: the panel refused the token: {error}", file=sys.stderr)
            return 2
        if error is not None:
            raise error
    return 0


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        code = asyncio.run(run(args))
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
