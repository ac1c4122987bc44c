"""The HTTP plumbing every remote member shares: timeouts, bounded retries, clear errors.

Every call a member makes is a pure read (tokenize, score a sequence), so every call is idempotent
and may be retried. Rules:

- a hard per-request deadline (``timeout_s``, connect to last byte): a server that accepts a
  connection and never answers, or trickles bytes forever (headers or body), cannot hang a request.
  httpx's own timeouts bound each socket operation, not the request, so every socket operation of
  the client's connections is given what is left of its request's deadline (``_DeadlineBackend``),
  the lookup of the server's name included (``_lookup``: ``getaddrinfo`` takes no timeout);
- transport failures (refused, reset, closed mid-answer, timed out) and 429/502/503/504 are retried
  ``retries`` times with exponential backoff, or after the server's ``Retry-After`` where it sends one
  (cut to one deadline of waiting in all); a llama.cpp server still loading its model (503 "Loading
  model") is asked again until one deadline has passed, however many attempts that takes; other
  4xx/5xx, redirects (not followed: named with where they point) and non-JSON bodies fail at once;
- a request ends when it is given up (``Call.abort``: the awaiting task was cancelled, Ctrl-C) or its
  client is closed: its sockets are shut, which wakes a thread blocked reading one (closing a socket
  does not, on Linux: such a call ran to its deadline and held the process's exit that long), and it
  is not retried;
- every failure surfaces as ``MemberError`` naming the member and the URL (a URL httpx cannot
  parse, a body it cannot decode, a client already closed included: those fail at once).

Why blocking ``httpx.Client`` and not ``AsyncClient``: decoders call ``Session.sync``/``step`` as
blocking functions inside ``member.run`` (a worker thread), the same contract the transformers
member has; members still run concurrently because ``run`` is awaited with ``asyncio.gather``.
"""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401 - registers its exit join first: ours runs before it (reverse order)
import contextvars
import email.utils
import ipaddress
import json
import logging
import math
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import httpcore
import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from ..errors import InvalidRequestError, MemberError
from .spec import check_url

RETRY_STATUS = frozenset({429, 502, 503, 504})

LOADING_POLL_S = 1.0
"""How often a llama.cpp server loading its model is asked again (where it sends no ``Retry-After``)."""

log = logging.getLogger(__name__)
T = TypeVar("T")


REMOTE_TIMEOUT_S = 60.0
"""A request's deadline where ``HttpSettings.timeout_s`` is not given (a server at a URL)."""


class HttpSettings(BaseModel):
    """Per-member network settings. Unknown keys are an error naming the key (a mistyped ``timeout``
    or ``api-key`` silently left the defaults, and no key, in place)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float | None = Field(None, gt=0)
    """Deadline for one request, connect to last byte; ``inf``: none. None: the backend's default,
    ``REMOTE_TIMEOUT_S`` for a server at a URL, none for a llama.cpp server this process starts (its
    answers take as long as its compute does: ``llamacpp.local_http``)."""
    connect_timeout_s: float = Field(5.0, gt=0)
    retries: int = Field(2, ge=0)
    """Extra attempts after a transport failure or a 429/502/503/504."""
    backoff_s: float = Field(0.25, ge=0)
    """First retry waits this long; each further retry doubles it."""
    api_key: SecretStr | None = None
    """Sent as ``Authorization: Bearer ...`` when set. A secret: dumps and reprs show ``**********``
    (an eval run's config.json, a resume's differences, logs), only the header carries it."""


class _Retryable(Exception):
    def __init__(self, reason: str, timed_out: bool = False, retry_after: float | None = None,
                 loading: bool = False) -> None:
        super().__init__(reason)
        self.timed_out = timed_out
        self.retry_after = retry_after
        """Seconds the server asked to wait (``Retry-After``), if it said."""
        self.loading = loading
        """A llama.cpp server still loading its model: asked again until a deadline has passed."""


class Call:
    """One blocking call of a member (``RemoteMember.run``), which another thread may give up: the
    sockets its requests are reading or writing are then shut (a blocked read returns at once) and it
    sends nothing more. Without it a cancelled request (a cancelled task, Ctrl-C) went on in its
    thread, retries included, until its deadline, and the process could not exit before."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: set[_DeadlineStream] = set()
        self._given_up = threading.Event()
        self.reason = "the call was cancelled"
        self.orphaned = False
        """Nobody awaits its result any more (its await was cancelled and the call left to run: llama.cpp's)."""

    @property
    def given_up(self) -> bool:
        return self._given_up.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless the call is given up first (then True)."""
        return self._given_up.wait(seconds)

    def hold(self, stream: _DeadlineStream) -> None:
        """``stream`` carries this call's request now; shut at once if the call was given up."""
        with self._lock:
            if not self.given_up:
                self._streams.add(stream)
                return
        stream.shut_for(self)

    def let_go(self) -> None:
        """The request ended: its connection goes back to the pool, for other calls."""
        with self._lock:
            self._streams.clear()

    def abort(self, reason: str = "the call was cancelled") -> None:
        """Give the call up (idempotent): shut the sockets it is using, send nothing more."""
        with self._lock:
            if not self.given_up:
                self.reason = reason
            self._given_up.set()
            streams, self._streams = list(self._streams), set()
        for stream in streams:
            stream.shut_for(self)


_CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar("member_call", default=None)


def in_call(call: Call, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` with its requests ended by ``call.abort`` (run it in a copied context)."""
    _CALL.set(call)
    return fn(*args)


class _Deadline(threading.local):
    """The deadline of the request this thread is sending (a blocking client sends a request's every
    byte from the calling thread, whichever pooled connection carries it), and the call it serves."""

    at: float | None = None
    call: Call | None = None

    def bound(self, timeout: float | None, late: type[Exception]) -> float | None:
        """``timeout`` cut to what is left of the deadline; ``late`` raised once nothing is left."""
        if self.at is None:
            return timeout
        left = self.at - time.monotonic()
        if left <= 0:
            raise late("the request's deadline passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read, write and TLS handshake ends by its request's deadline."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: _Deadline) -> None:
        self._stream, self._deadline = stream, deadline
        self._lock = threading.Lock()
        self._owner: Call | None = None
        """The call whose request this connection carries (or last carried: it may be idle in the pool)."""
        self._shut = False

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._held()
        return self._stream.read(max_bytes, self._deadline.bound(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._held()
        self._stream.write(buffer, self._deadline.bound(timeout, httpcore.WriteTimeout))

    def _held(self) -> None:
        """Let the call this thread serves shut this connection (``Call.abort``). A connection another call
        shut after its request ended (given up as the connection went back to the pool) is not this
        call's failure: httpcore's pool is told it is not available and sends the request on another."""
        call = self._deadline.call
        with self._lock:
            if self._shut and self._owner is not call:
                raise httpcore.ConnectionNotAvailable()
            self._owner = call
        if call is not None:
            call.hold(self)

    def shut_for(self, call: Call) -> None:
        """``shut``, unless the connection carries another call's request by now (it went back to the pool
        between the end of ``call``'s request and ``Call.let_go``, and another call took it)."""
        with self._lock:
            if self._owner is not call:
                return
            self._shut = True
        self.shut()

    def shut(self) -> None:
        """Shut the socket both ways, from any thread: a read blocked on it returns (end of stream).
        ``socket.socket.shutdown`` itself: an ``SSLSocket``'s own drops its TLS state under the reader."""
        sock = self._stream.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:  # already closed or never connected: nothing is blocked on it
                pass

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        stream = self._stream.start_tls(ssl_context, server_hostname,
                                        self._deadline.bound(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(stream, self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's blocking sockets, each operation bounded by the request's deadline."""

    def __init__(self, deadline: _Deadline) -> None:
        self._backend = httpcore.SyncBackend()
        self._deadline = deadline

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        """The host's name looked up within the connect timeout and the deadline (``_lookup``), then
        its addresses tried in turn, as ``socket.create_connection`` tries them."""
        failed: httpcore.ConnectError | httpcore.ConnectTimeout | None = None
        for address in _lookup(host, port, self._deadline.bound(timeout, httpcore.ConnectTimeout)):
            bound = self._deadline.bound(timeout, httpcore.ConnectTimeout)  # raises once the deadline passed
            try:
                stream = self._backend.connect_tcp(address, port, bound, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:  # refused, or a silent address
                failed = exc
                continue
            return _DeadlineStream(stream, self._deadline)
        raise failed or httpcore.ConnectError(f"{host} has no address")

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore.NetworkStream:
        stream = self._backend.connect_unix_socket(path, self._deadline.bound(timeout, httpcore.ConnectTimeout),
                                                   socket_options)
        return _DeadlineStream(stream, self._deadline)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def _lookup(host: str, port: int, timeout: float | None) -> list[str]:
    """The addresses of ``host``, in ``getaddrinfo``'s order, or ConnectTimeout after ``timeout``.
    ``getaddrinfo`` (which ``socket.create_connection`` calls) takes no timeout and cannot be
    interrupted, so a hung resolver held a request far past its deadline; the lookup runs in a
    thread of its own, left to end by itself when the request stops waiting for it."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    answer: list[Any] = []
    done = threading.Event()

    def look_up() -> None:
        try:
            answer.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            answer.append(exc)
        finally:
            done.set()

    threading.Thread(target=look_up, name=f"lookup-{host}", daemon=True).start()
    if not done.wait(timeout):
        raise httpcore.ConnectTimeout(f"looking up {host} took over {timeout:g} s")
    if isinstance(answer[0], OSError):
        raise httpcore.ConnectError(str(answer[0])) from answer[0]
    return list(dict.fromkeys(str(sockaddr[0]) for *_, sockaddr in answer[0]))


def _bound_by_deadline(client: httpx.Client, deadline: _Deadline) -> None:
    """Make ``client``'s connection pools (the default one and any proxy's) open their connections
    through ``_DeadlineBackend``. httpx has no public hook for a network backend; its transports keep
    an httpcore pool in ``_pool``, which creates every connection with ``_network_backend``."""
    backend = _DeadlineBackend(deadline)
    transports = [client._transport, *client._mounts.values()]
    pools = [getattr(t, "_pool", None) for t in transports]
    bounded = [pool for pool in pools if isinstance(pool, httpcore.ConnectionPool)]
    if not bounded or not hasattr(bounded[0], "_network_backend"):
        raise RuntimeError(f"httpx {httpx.__version__} keeps its connections where this client cannot bound "
                           "them by a deadline (members/http.py, _bound_by_deadline)")
    for pool in bounded:
        pool._network_backend = backend


def is_loopback(url: str) -> bool:
    """Whether ``url`` names this machine: 127.0.0.0/8 (also written short, ``127.1``), ::1 and its
    IPv4-mapped form, 0.0.0.0 / :: (which llama-server prints as where it listens, and which reach this
    machine), ``localhost`` and ``*.localhost`` (RFC 6761), a final dot allowed. Such calls never go
    through an ``HTTP_PROXY`` from the environment: with one set and no ``NO_PROXY`` for them (common on
    corporate machines and clusters) the in-process llama.cpp servers started, then every member call
    went to the proxy and failed as "connection refused" at the member's own URL."""
    host = httpx.URL(url).host.rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:
            address = ipaddress.IPv4Address(socket.inet_aton(host))  # the short forms: 127.1, 2130706433
        except OSError:
            return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


_CLIENTS: weakref.WeakSet[JsonClient] = weakref.WeakSet()
"""Every client of this process, for ``_abort_at_exit``."""


def _abort_at_exit() -> None:
    """At interpreter exit, give up the member calls still in flight. The members' worker threads are
    joined at exit (``concurrent.futures``), and one blocked reading a server's answer held the process
    until the server answered: after Ctrl-C during a long prompt's prefill in an in-process llama.cpp
    server, 158 s. Registered with ``threading``'s exit hooks, which run before those joins; a call
    given up here reports "the process is exiting" to a thread nobody waits on any more."""
    crashed = getattr(sys, "last_value", None) is not None  # the main thread ended on an exception (Ctrl-C)
    for client in list(_CLIENTS):  # on a normal end (or sys.exit) Python waits for its threads, and a
        if client.pid == os.getpid():  # non-daemon thread's call is its user's: only orphaned calls are given
            client.abort_calls("the process is exiting", closing=crashed,  # up (a Ctrl-C the script caught)
                               orphans_only=not crashed)  # (a forked child's copies hold the parent's sockets)


_register_exit_hook = getattr(threading, "_register_atexit", None)  # CPython 3.9+: runs before the joins
if _register_exit_hook is not None:
    _register_exit_hook(_abort_at_exit)


class JsonClient:
    """JSON over HTTP for one member on one server."""

    def __init__(self, member: str, base_url: str, settings: HttpSettings | None = None) -> None:
        self.member = member
        self.base_url = base_url.rstrip("/")
        self.settings = settings or HttpSettings()
        given = REMOTE_TIMEOUT_S if self.settings.timeout_s is None else self.settings.timeout_s
        self.deadline_s = None if math.isinf(given) else given
        """Seconds a request may take, connect to last byte; None: no deadline."""
        key = self.settings.api_key.get_secret_value() if self.settings.api_key else ""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        timeout = httpx.Timeout(self.deadline_s, connect=self.settings.connect_timeout_s)
        try:
            check_url(self.base_url)
            # on this machine: a transport of our own, so no proxy from the environment (httpx reads
            # those only without one), while SSL_CERT_FILE and .netrc still count as elsewhere
            local = httpx.HTTPTransport(trust_env=True) if is_loopback(self.base_url) else None
            self._client = httpx.Client(base_url=self.base_url, timeout=timeout, headers=headers, transport=local)
        except (InvalidRequestError, httpx.InvalidURL) as exc:
            raise self.error(str(exc)) from None
        self._deadline = _Deadline()
        self._calls_lock = threading.Lock()
        self._calls: set[Call] = set()
        self._closed = False
        self.pid = os.getpid()
        _CLIENTS.add(self)
        try:
            _bound_by_deadline(self._client, self._deadline)
        except BaseException:
            self._client.close()
            raise

    def close(self) -> None:
        """End the calls in flight (their sockets shut: a thread blocked reading one wakes and reports
        "the member is closed", where it ran to its deadline), then close the connections."""
        self.abort_calls("the member is closed", closing=True)
        self._client.close()

    def abort_calls(self, reason: str, closing: bool = False, orphans_only: bool = False) -> None:
        """Give up every call in flight (``closing``: and start none; ``orphans_only``: those nobody awaits)."""
        with self._calls_lock:
            self._closed = self._closed or closing
            calls = [call for call in self._calls if call.orphaned or not orphans_only]
        for call in calls:
            call.abort(reason)

    def error(self, reason: str, status: int | None = None) -> MemberError:
        return MemberError(self.member, self.base_url, reason, status)

    def get(self, path: str) -> Any:
        return self._call("GET", path, None)

    def post(self, path: str, body: dict[str, Any], retry_timeouts: bool = True) -> Any:
        """``retry_timeouts=False``: a call that outlived the deadline is not sent again (a llama.cpp
        server goes on computing an abandoned ``/completion``; a retry queued behind it in the same slot
        timed out too, and the server computed every copy)."""
        return self._call("POST", path, body, retry_timeouts)

    def _v1_hint(self, status: int) -> str:
        """For a 404 at a URL ending in /v1 (the OpenAI base URL users copy): the member adds the API's
        paths itself, so it asked for /v1/v1/models."""
        url = httpx.URL(self.base_url)
        if status != 404 or not url.path.rstrip("/").endswith("/v1"):
            return ""
        root = str(url.copy_with(path=url.path.rstrip("/").removesuffix("/v1") or "/")).rstrip("/")
        return f" (the URL ends in /v1: give the server's root, {root}; the member adds /v1/... itself)"

    def _call(self, method: str, path: str, body: dict[str, Any] | None, retry_timeouts: bool = True) -> Any:
        call = _CALL.get() or Call()
        with self._calls_lock:
            if self._closed:
                call.abort("the member is closed")
            self._calls.add(call)
        self._deadline.call = call
        try:
            return self._attempts(call, method, path, body, retry_timeouts)
        finally:
            self._deadline.call = None
            with self._calls_lock:
                self._calls.discard(call)

    def _attempts(self, call: Call, method: str, path: str, body: dict[str, Any] | None,
                  retry_timeouts: bool) -> Any:
        """``retries`` more attempts after a passing failure, and as many as one deadline of waiting
        allows while a llama.cpp server loads its model. The backoff between them is short and sleeps;
        a wait the server asks for (``Retry-After``, a model loading) may be long, and ends with the call."""
        patience = self.deadline_s or REMOTE_TIMEOUT_S  # the most this call waits between attempts, in all
        retries, attempts, waited = 0, 0, 0.0
        while True:
            if call.given_up:
                raise self.error(f"{method} {path}: {call.reason}")
            attempts += 1
            try:
                return self._once(call, method, path, body)
            except _Retryable as exc:
                failure = exc
            if failure.timed_out and not retry_timeouts:
                raise self.error(f"{method} {path} failed: {failure} (not retried: the server may still be "
                                 "computing it)") from None
            if not failure.loading:
                retries += 1
                if retries > self.settings.retries:
                    break
            if failure.retry_after is None and not failure.loading:
                time.sleep(self.settings.backoff_s * 2 ** (retries - 1))
                continue
            left = patience - waited
            if left <= 0:  # a deadline of waiting spent
                break
            wait = min(LOADING_POLL_S if failure.retry_after is None else failure.retry_after, left)
            if failure.loading:
                log.info("member %s: the server at %s is loading its model; asking again in %.1f s (waited "
                         "%.1f s of at most %g s)", self.member, self.base_url, wait, waited, patience)
            if call.wait(wait):
                raise self.error(f"{method} {path}: {call.reason}")
            waited += wait
        after = f" (waited {waited:.1f} s as the server asked)" if waited else ""
        raise self.error(f"{method} {path} failed after {attempts} attempt(s){after}: {failure}")

    def _once(self, call: Call, method: str, path: str, body: dict[str, Any] | None) -> Any:
        self._deadline.at = None if self.deadline_s is None else time.monotonic() + self.deadline_s
        try:
            with self._client.stream(method, path, json=body) as response:
                chunks = list(response.iter_bytes())
                status = response.status_code
                location = response.headers.get("location")
                retry_after = response.headers.get("retry-after")
        except httpx.TransportError as exc:
            if call.given_up:  # its sockets were shut under it (Call.abort): not a fault of the server
                raise self.error(f"{method} {path}: {call.reason}") from exc
            raise self._retryable(exc) from exc
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            # not a passing fault of the server: a body httpx cannot decode (a wrong Content-Encoding),
            # a path it cannot parse; retrying would get the same
            raise self.error(f"{method} {path} failed: {type(exc).__name__}: {exc}") from exc
        except RuntimeError as exc:  # httpx refuses to send on a closed client
            if not self._client.is_closed:
                raise
            raise self.error(f"{method} {path}: the member is closed") from exc
        finally:
            self._deadline.at = None
            call.let_go()
        text = b"".join(chunks).decode("utf-8", "replace")
        if status in RETRY_STATUS:
            raise _Retryable(f"HTTP {status}: {text[:200]}", retry_after=_retry_after(retry_after),
                             loading=status == 503 and _loading(text))
        if status >= 400:
            raise self.error(f"{method} {path} answered HTTP {status}: {text[:300]}{self._v1_hint(status)}", status)
        if 300 <= status < 400:  # not followed (a POST would be resent as a GET, a key to another host)
            where = f" to {location}" if location else ""
            raise self.error(f"{method} {path} answered HTTP {status}, a redirect{where}: give the member the URL "
                             "the server answers at")
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise self.error(f"{method} {path} answered something that is not JSON: {text[:200]!r}") from exc

    def _retryable(self, exc: httpx.TransportError) -> _Retryable:
        """A transport failure, to try again: the deadline passed, or the connection failed."""
        if isinstance(exc, httpx.TimeoutException):
            after = f" after {self.deadline_s:g} s" if self.deadline_s is not None else ""
            return _Retryable(f"timed out{after} ({type(exc).__name__})", timed_out=True)
        return _Retryable(f"{type(exc).__name__}: {exc or 'connection failed'}")


def _retry_after(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait: a number of seconds or an HTTP date; None when
    absent or unreadable (then the usual backoff)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time()) if when.tzinfo is not None else None


def _loading(text: str) -> bool:
    """A llama.cpp server still loading its model answers 503 ``{"error": {"message": "Loading model",
    "type": "unavailable_error"}}`` (for as long as the load takes: seconds to minutes)."""
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(error, dict) and str(error.get("message", "")).lower().startswith("loading model")
