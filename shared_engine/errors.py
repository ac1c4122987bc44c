"""Typed errors: every bad input surfaces as a ValueError subclass with a message a user can act on."""

from __future__ import annotations


class EnsembleError(Exception):
    """Base class of the engine's own errors."""


class InvalidRequestError(EnsembleError, ValueError):
    """The request (prompt, messages or parameters) cannot be served as given."""


class InvalidParametersError(InvalidRequestError):
    """Parameters that failed validation (``options.validated``), with the first problem's location
    (``"response_format.json_schema"``) and pydantic's error type (``"missing"``, ``"string_type"``): the
    server's error ``param`` and ``code`` are read from them, not from the message's text, which a value
    (a tool named "x: Field required") could fake and which joins every problem into one line."""

    def __init__(self, message: str, loc: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.loc = loc
        self.kind = kind

    def __reduce__(self) -> tuple[type[InvalidParametersError], tuple[str, str | None, str | None]]:
        """Rebuilt from its parts (``args`` holds the message alone), as ``MemberError``."""
        return type(self), (str(self), self.loc, self.kind)


class ContextLengthError(InvalidRequestError):
    """Prompt plus max_new_tokens exceed the smallest member's context window."""


class EngineClosedError(EnsembleError, RuntimeError):
    """The engine was closed (``close()`` / end of its ``with`` block); it takes no new requests."""


class MemberError(EnsembleError, RuntimeError):
    """A member's backend failed (server down, timed out, or answered garbage).

    Names the member and the URL so that the user knows which server to look at. The engine stays
    usable: every request builds fresh sessions, so the next request starts clean.
    """

    def __init__(self, member: str, url: str, reason: str, status: int | None = None) -> None:
        super().__init__(f"member {member!r} at {url}: {reason}")
        self.member = member
        self.url = url
        self.reason = reason
        self.status = status
        """The HTTP status the backend answered with, where it answered one (4xx: it refused the request,
        which callers tell apart from a server down without reading the wording of ``reason``)."""

    def __reduce__(self) -> tuple[type[MemberError], tuple[str, str, str, int | None]]:
        """Rebuilt from its parts: ``args`` holds the message alone, so unpickling (a process
        pool's worker failing, a checkpointer) or ``copy`` called ``__init__`` with one argument and
        raised a TypeError; a pool reported BrokenProcessPool and the cause was lost."""
        return type(self), (self.member, self.url, self.reason, self.status)
