"""The HTTP plumbing every remote member shares: timeouts, bounded retries, clear errors.

Every call a member makes is a pure read (tokenize, score a sequence), so every call is idempotent
and may be retried. Rules:

- a hard per-request deadline (``timeout_s``, checked while the body streams in too): a server
  that accepts a connection and never answers, or trickles bytes forever, cannot hang a request;
- transport failures (refused, reset, closed mid-answer, timed out) and 429/502/503/504 are retried
  ``retries`` times with exponential backoff; other 4xx/5xx and non-JSON bodies fail at once;
- every failure surfaces as ``MemberError`` naming the member and the URL (a URL httpx cannot
  parse, a body it cannot decode, a client already closed included: those fail at once).

Why blocking ``httpx.Client`` and not ``AsyncClient``: decoders call ``Session.sync``/``step`` as
blocking functions inside ``member.run`` (a worker thread), the same contract the transformers
member has; members still run concurrently because ``run`` is awaited with ``asyncio.gather``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from ..errors import InvalidRequestError, MemberError
from .spec import check_url

RETRY_STATUS = frozenset({429, 502, 503, 504})


class HttpSettings(BaseModel):
    """Per-member network settings."""

    model_config = ConfigDict(frozen=True)

    timeout_s: float = Field(60.0, gt=0)
    """Deadline for one request, connect to last byte."""
    connect_timeout_s: float = Field(5.0, gt=0)
    retries: int = Field(2, ge=0)
    """Extra attempts after a transport failure or a 429/502/503/504."""
    backoff_s: float = Field(0.25, ge=0)
    """First retry waits this long; each further retry doubles it."""
    api_key: str | None = None
    """Sent as ``Authorization: Bearer ...`` when set."""


class _Retryable(Exception):
    pass


class JsonClient:
    """JSON over HTTP for one member on one server."""

    def __init__(self, member: str, base_url: str, settings: HttpSettings | None = None) -> None:
        self.member = member
        self.base_url = base_url.rstrip("/")
        self.settings = settings or HttpSettings()
        headers = {"Authorization": f"Bearer {self.settings.api_key}"} if self.settings.api_key else {}
        timeout = httpx.Timeout(self.settings.timeout_s, connect=self.settings.connect_timeout_s)
        try:
            check_url(self.base_url)
            self._client = httpx.Client(base_url=self.base_url, timeout=timeout, headers=headers)
        except (InvalidRequestError, httpx.InvalidURL) as exc:
            raise self.error(str(exc)) from None

    def close(self) -> None:
        self._client.close()

    def error(self, reason: str) -> MemberError:
        return MemberError(self.member, self.base_url, reason)

    def get(self, path: str) -> Any:
        return self._call("GET", path, None)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self._call("POST", path, body)

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        attempts = self.settings.retries + 1
        last = ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.settings.backoff_s * 2 ** (attempt - 1))
            try:
                return self._once(method, path, body)
            except _Retryable as exc:
                last = str(exc)
        raise self.error(f"{method} {path} failed after {attempts} attempt(s): {last}")

    def _once(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        deadline = time.monotonic() + self.settings.timeout_s
        try:
            with self._client.stream(method, path, json=body) as response:
                chunks = []
                for chunk in response.iter_bytes():
                    chunks.append(chunk)
                    if time.monotonic() > deadline:
                        raise _Retryable(f"no complete answer within {self.settings.timeout_s:g} s")
                status = response.status_code
        except httpx.TimeoutException as exc:
            raise _Retryable(f"timed out after {self.settings.timeout_s:g} s ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc or 'connection failed'}") from exc
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError) as exc:
            # not a passing fault of the server: a body httpx cannot decode (a wrong Content-Encoding),
            # a path it cannot parse; retrying would get the same
            raise self.error(f"{method} {path} failed: {type(exc).__name__}: {exc}") from exc
        except RuntimeError as exc:  # httpx refuses to send on a closed client
            if not self._client.is_closed:
                raise
            raise self.error(f"{method} {path}: the member is closed") from exc
        text = b"".join(chunks).decode("utf-8", "replace")
        if status in RETRY_STATUS:
            raise _Retryable(f"HTTP {status}: {text[:200]}")
        if status >= 400:
            raise self.error(f"{method} {path} answered HTTP {status}: {text[:300]}")
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise self.error(f"{method} {path} answered something that is not JSON: {text[:200]!r}") from exc
