"""``safe-ensemble serve``: the subcommand's arguments and entry point (starlette and uvicorn are
imported only when it runs)."""

from __future__ import annotations

import argparse
import os
import sys

from ..engine_args import add_engine_args, engine_from_args
from ..loading import load_with_notice
from ..member_flags import BACKEND_HELP
from ..members import LOCAL_BACKENDS
from ..options import DEFAULT_MAX_ACTIVE, METHODS


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server with a live page at /")
    add_engine_args(serve)
    serve.add_argument("--method", choices=METHODS, default="safe")
    serve.add_argument("--backend", choices=LOCAL_BACKENDS, help=BACKEND_HELP)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", help="the `model` clients send (default: <method>-ensemble)")
    serve.add_argument("--max-active", type=int, default=DEFAULT_MAX_ACTIVE,
                       help=f"requests generating at once (default {DEFAULT_MAX_ACTIVE}); also the slots of "
                            "each in-process llama.cpp member that sets none, one per active request")
    serve.add_argument("--max-waiting", type=int, default=16, help="requests queued beyond those (then 429)")
    serve.add_argument("--api-key", default=os.environ.get("SAFE_ENSEMBLE_API_KEY"),
                       help="require 'Authorization: Bearer KEY' on every /v1 route (default: "
                            "$SAFE_ENSEMBLE_API_KEY; unset: open)")


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from .app import create_app
    except ImportError as err:
        print(f"error: {err.name} is missing; install the server extra: pip install 'safe-ensemble[server]'",
              file=sys.stderr)
        return 2
    engine = engine_from_args(args, args.method)
    app = create_app(engine, model_name=args.served_model_name, max_active=args.max_active,
                     max_waiting=args.max_waiting, api_key=args.api_key)
    load_with_notice(engine)  # before the address is printed: the server answers once it is ready
    print(f"serving `{app.state.model_name}` ({args.method}: {', '.join(args.models)}) on "
          f"http://{args.host}:{args.port}/  (OpenAI base_url: http://{args.host}:{args.port}/v1)",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=5)
    return 0
