"""Run an app with uvicorn on a free loopback port in a background thread (tests, notebooks,
the cookbook): ``with serve_in_background(app) as base_url: ...``."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from starlette.types import ASGIApp


@contextmanager
def serve_in_background(app: ASGIApp, host: str = "127.0.0.1", startup_timeout_s: float = 600.0
                        ) -> Iterator[str]:
    """Yield the server's base URL (``http://127.0.0.1:PORT``) once it accepts requests.

    The socket is bound here (port 0: the OS picks a free port) and handed to uvicorn, so no
    other process can take the port in between. Startup includes loading the members' weights."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name=f"uvicorn:{port}")
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("the server did not start (see the log above)")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
