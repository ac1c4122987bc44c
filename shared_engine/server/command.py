"""``safe-ensemble serve``: the subcommand's arguments and entry point (starlette and uvicorn are
imported only when it runs)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING

from ..engine_args import add_engine_args, default_method, engine_from_args
from ..loading import load_with_notice
from ..member_flags import BACKEND_HELP
from ..members import LOCAL_BACKENDS
from ..options import DEFAULT_MAX_ACTIVE, METHODS

if TYPE_CHECKING:
    import uvicorn
    from starlette.applications import Starlette

GRACE_S = 5
"""On Ctrl+C / SIGTERM, how long running requests get to finish before they are ended."""


def _int_from(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` (to ``high``), else a one-line usage error, not a
    traceback once the models have loaded."""
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
        if number < low or (high is not None and number > high):
            raise argparse.ArgumentTypeError(f"must be {low} or more" if high is None else
                                             f"must be from {low} to {high}, got {number}")
        return number
    return parse


def _listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the models load: a port in use (or a host that is no
    address of this machine) is reported at once, not after loading and "serving on ..."."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn decides
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _origins(value: str) -> list[str]:
    """``--allowed-origins``: comma-separated ``scheme://host[:port]`` or ``*``, checked before anything loads
    (a browser sends an origin without a path, so one with a path would never match)."""
    origins = [o.strip().rstrip("/") for o in value.split(",") if o.strip()]
    for origin in origins:
        scheme, sep, rest = origin.partition("://")
        if origin != "*" and (not sep or scheme not in ("http", "https") or not rest or "/" in rest):
            raise argparse.ArgumentTypeError(f"{origin!r} is not an origin: give scheme://host[:port] "
                                             "(e.g. https://app.example, http://localhost:3000) or *")
    if not origins:
        raise argparse.ArgumentTypeError("give at least one origin")
    return origins


def _draining_server(app: Starlette, grace_s: int) -> uvicorn.Server:
    """A uvicorn server that, when shutdown begins, first shuts the app down (``app.shut_down``:
    503s for new and queued requests, the grace for running ones, then the engine closed, so every
    stream ends with [DONE]); uvicorn's own grace then only waits for the last bytes to go out."""
    import uvicorn

    from .app import shut_down

    log = logging.getLogger("uvicorn.error")

    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            load = app.state.admission.load()
            log.info("Shutting down: %d running requests get up to %g s to finish; %d queued and any new "
                     "ones get a 503", load.active, grace_s, load.waiting)
            await shut_down(app, grace_s, hurry=lambda: self.force_exit)
            await super().shutdown(sockets)
            if self.force_exit and not self.lifespan.shutdown_event.is_set():
                # uvicorn skips the app's lifespan shutdown on a second Ctrl+C, and the lifespan task,
                # left waiting, was cancelled at exit: a CancelledError traceback. The app's shutdown
                # does nothing to wait for (shut_down has closed the engine or been hurried past it).
                await self.lifespan.shutdown()

    return DrainingServer(uvicorn.Config(app, log_level="info", timeout_graceful_shutdown=grace_s))


@contextmanager
def _sigterm_as_sigint() -> Iterator[None]:
    """SIGTERM (docker stop, systemd, kill) shuts down as Ctrl+C does: uvicorn shuts down gracefully on
    either, then raises the signal again for the handler it found; this one makes that re-raised
    SIGTERM a ``KeyboardInterrupt``, so the command exits 0, not killed by the signal (-15)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server with a live page at /")
    add_engine_args(serve)
    serve.add_argument("--method", choices=METHODS, help="default: safe (single with one model)")
    serve.add_argument("--backend", choices=LOCAL_BACKENDS, help=BACKEND_HELP)
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)")
    serve.add_argument("--port", type=_int_from(0, 65535), default=8000,
                       help="0: any free port (the address printed names the one bound)")
    serve.add_argument("--served-model-name", help="the `model` clients send (default: <method>-ensemble)")
    serve.add_argument("--max-active", type=_int_from(1), default=DEFAULT_MAX_ACTIVE,
                       help=f"requests generating at once (default {DEFAULT_MAX_ACTIVE}); also the slots of "
                            "each in-process llama.cpp member that sets none, one per active request")
    serve.add_argument("--max-waiting", type=_int_from(0), default=16,
                       help="requests queued beyond those, then 429 (default 16)")
    serve.add_argument("--api-key", default=os.environ.get("SAFE_ENSEMBLE_API_KEY"),
                       help="require 'Authorization: Bearer KEY' on every /v1 route (default: "
                            "$SAFE_ENSEMBLE_API_KEY; unset: open)")
    serve.add_argument("--allowed-origins", type=_origins, default=[], metavar="ORIGIN[,ORIGIN]",
                       help="web pages whose scripts may call the server from a browser (CORS), e.g. "
                            "https://app.example or * (default: none; the live page at / needs none)")


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn  # noqa: F401 - the server extra is installed (here, not after loading)

        from .app import create_app
    except ImportError as err:
        print(f"error: {err.name} is missing; install the server extra: pip install -e '.[server]' in a clone",
              file=sys.stderr)
        return 2
    try:
        sock = _listening_socket(args.host, args.port)
    except OSError as err:
        print(f"error: cannot listen on {args.host}:{args.port}: {err.strerror or err}", file=sys.stderr)
        return 1
    args.method = args.method or default_method(args.models)  # as run / eval / bench: one model is single
    with sock:
        engine = engine_from_args(args, args.method)
        app = create_app(engine, model_name=args.served_model_name, max_active=args.max_active,
                         max_waiting=args.max_waiting, api_key=args.api_key,
                         allowed_origins=args.allowed_origins)
        load_with_notice(engine)  # before the address is printed: the server answers once it is ready
        host = f"[{args.host}]" if ":" in args.host else args.host
        address = f"http://{host}:{sock.getsockname()[1]}"
        print(f"serving `{app.state.model_name}` ({args.method}: {', '.join(args.models)}) on "
              f"{address}/  (OpenAI base_url: {address}/v1)", file=sys.stderr, flush=True)
        server = _draining_server(app, GRACE_S)
        # Ctrl+C or SIGTERM: uvicorn shuts down, then re-raises the signal
        with _sigterm_as_sigint(), suppress(KeyboardInterrupt):
            server.run(sockets=[sock])
    return 0 if server.started else 1
