"""Run one fake upstream in the foreground (for ``arona demo`` and the benchmark).

``python -m app.fakes --kind openai|vllm|ollama|minimax --port N [--name X]
[--models a,b] [--chunks N] [--api-key K] [--prefix /api/paas/v4] [--running R
--waiting W --kv-cache C] [--polls N]`` prints the base URL once it listens and runs
until SIGINT/SIGTERM. Steer it with ``POST /__fake/control``; ``--running``,
``--waiting`` and ``--kv-cache`` set the load a ``vllm`` fake reports at ``/metrics``;
``--polls`` the ``Processing`` polls of a ``minimax`` fake's tasks.
"""

from __future__ import annotations

import argparse

from app.fakes.common import FakeUpstream
from app.fakes.minimax_upstream import FakeMinimax
from app.fakes.ollama_upstream import FakeOllama
from app.fakes.openai_upstream import FakeOpenAI
from app.fakes.serve import run_in_foreground, serve_asgi, wait_for_stop_signal
from app.fakes.vllm_upstream import FakeVllm


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m app.fakes", description=__doc__)
    parser.add_argument("--kind", choices=("openai", "vllm", "ollama", "minimax"), default="openai")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--name", default=None, help="appears in replies")
    parser.add_argument("--models", default=None, help="comma-separated model list")
    parser.add_argument("--chunks", type=int, default=5, help="content frames per stream")
    parser.add_argument("--api-key", default=None, help="require this Bearer key (openai, minimax)")
    parser.add_argument("--prefix", default="", help="path-style prefix (openai)")
    parser.add_argument("--running", type=float, default=0.0, help="running requests (vllm)")
    parser.add_argument("--waiting", type=float, default=0.0, help="waiting requests (vllm)")
    parser.add_argument("--kv-cache", type=float, default=0.0, help="KV cache use, 0-1 (vllm)")
    parser.add_argument(
        "--polls", type=int, default=2, help="Processing polls before Success (minimax)"
    )
    return parser.parse_args(argv)


def build_fake(args: argparse.Namespace) -> FakeUpstream | FakeMinimax:
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    if args.kind == "minimax":
        minimax_name = args.name or "fake-minimax"
        if models is None:
            return FakeMinimax(minimax_name, api_key=args.api_key, processing_polls=args.polls)
        return FakeMinimax(
            minimax_name, models=models, api_key=args.api_key, processing_polls=args.polls
        )
    if args.kind == "ollama":
        if models is None:
            return FakeOllama(args.name or "fake-ollama", chunks=args.chunks)
        return FakeOllama(args.name or "fake-ollama", models=models, chunks=args.chunks)
    if args.kind == "vllm":
        vllm_name = args.name or "fake-vllm"
        vllm = (
            FakeVllm(vllm_name, chunks=args.chunks)
            if models is None
            else FakeVllm(vllm_name, models=models, chunks=args.chunks)
        )
        vllm.running, vllm.waiting, vllm.kv_cache = args.running, args.waiting, args.kv_cache
        return vllm
    name = args.name or "fake-openai"
    if models is None:
        return FakeOpenAI(name, prefix=args.prefix, api_key=args.api_key, chunks=args.chunks)
    return FakeOpenAI(
        name, models=models, prefix=args.prefix, api_key=args.api_key, chunks=args.chunks
    )


async def run(args: argparse.Namespace) -> None:
    fake = build_fake(args)
    async with serve_asgi(fake, args.host, args.port) as url:
        print(f"{args.kind} fake {fake.name!r} listening on {url}", flush=True)
        await wait_for_stop_signal()


def main(argv: list[str] | None = None) -> None:
    run_in_foreground(run(parse_args(argv)))


if __name__ == "__main__":
    main()
