"""``python -m envs.openenv serve``: SearchTeam as an OpenEnv server.

    python -m envs.openenv serve [--port 8000] [--max-sessions 8] [--idle-timeout 300]
                                 [--retriever-url URL] [--workflow cascade] [--top-k 3] ...

Every WebSocket session (OpenEnv's ``EnvClient``, ``GenericEnvClient``, or
``envs.openenv.client.SearchTeamClient``) holds one episode at a time; one step is one
whole turn; a session silent for ``--idle-timeout`` seconds is dropped, freeing its place.
Plain HTTP ``/reset`` and ``/step`` share one env and keep no episode between requests.
``openenv validate --url http://127.0.0.1:PORT`` checks the running server.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

DEFAULT_IDLE_TIMEOUT_S = 300.0
"""``envs.openenv.server.DEFAULT_IDLE_TIMEOUT_S`` (not imported here: the server needs the extra)."""


def env_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``envs.make_env`` keyword arguments from the command line (the retriever and the
    tokenizer built here, once)."""
    from envs.retrieval.factory import make_retriever

    kwargs: dict[str, Any] = {k: getattr(args, k) for k in (
        "workflow", "max_waves", "max_searchers", "max_searcher_turns", "num_candidates", "top_k",
        "max_turn_tokens", "max_context_tokens")}
    kwargs["retriever"] = make_retriever(args.retriever_url or args.retriever)
    if args.tokenizer:
        from envs.tokenizer import load_tokenizer

        kwargs["tokenizer"] = load_tokenizer(args.tokenizer)
    return kwargs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.openenv", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve SearchTeam over OpenEnv's HTTP/WebSocket API")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--max-sessions", type=int, default=8,
                       help="concurrent WebSocket sessions (one GRPO group of G needs G); one more is refused")
    serve.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S, metavar="SECONDS",
                       help="drop a session that sends nothing for this long, freeing its place "
                            f"(default {DEFAULT_IDLE_TIMEOUT_S:g}; 0: never)")
    serve.add_argument("--retriever", default="default",
                       help="default (MiniLM over the synthetic world), words, or a corpus JSONL")
    serve.add_argument("--retriever-url", default=None,
                       help="a retrieval server (python -m envs.retrieval serve): batched, shared by sessions")
    serve.add_argument("--tokenizer", default=None, help="tokenizer name or path (default SmolLM2's)")
    serve.add_argument("--workflow", default="hierarchical", choices=["hierarchical", "cascade"],
                       help="the default workflow; a reset may ask for the other")
    for name, default in (("max-waves", 3), ("max-searchers", 3), ("max-searcher-turns", 4),
                          ("num-candidates", 5), ("top-k", 3), ("max-turn-tokens", 256),
                          ("max-context-tokens", 4096)):
        serve.add_argument(f"--{name}", type=int, default=default, help=f"env setting (default {default})")
    args = parser.parse_args(argv)
    if not (0 <= args.idle_timeout < float("inf")) or args.max_sessions < 1:
        parser.error(f"--idle-timeout must be >= 0 seconds (0: never) and --max-sessions >= 1, got "
                     f"{args.idle_timeout!r} and {args.max_sessions}")
    import uvicorn

    from envs.openenv.server import make_app

    app = make_app(env_kwargs(args), max_sessions=args.max_sessions,
                   idle_timeout_s=args.idle_timeout or None)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
