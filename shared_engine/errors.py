"""Typed errors: every bad input surfaces as a ValueError subclass with a message a user can act on."""


class EnsembleError(Exception):
    """Base class of the engine's own errors."""


class InvalidRequestError(EnsembleError, ValueError):
    """The request (prompt, messages or parameters) cannot be served as given."""


class ContextLengthError(InvalidRequestError):
    """Prompt plus max_new_tokens exceed the smallest member's context window."""


class EngineClosedError(EnsembleError, RuntimeError):
    """The engine was closed (``close()`` / end of its ``with`` block); it takes no new requests."""
