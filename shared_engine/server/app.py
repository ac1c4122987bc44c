"""The OpenAI-compatible HTTP app over one shared ``EnsembleEngine``.

    app = create_app(EnsembleEngine(["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]))
    uvicorn.run(app, port=8000)          # or: safe-ensemble serve --models a,b

Routes: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (a prompt the answer continues as plain
text, in no chat format; streamed or not), ``GET /v1/models`` (and ``/v1/models/{id}``),
``GET /health`` and ``GET /`` (the live page). Every error is an OpenAI-style ``{"error": {message, type, param,
code}}`` body. With ``api_key`` set, every route but the page and ``/health`` wants ``Authorization: Bearer <key>``
(else a 401 ``invalid_api_key``); ``/health`` and the page stay open. Requests share the engine
(each has its own sessions; a transformers member runs one forward at a time, a llama.cpp server
batches the requests' slots), at most ``max_active`` run at once and ``max_waiting`` more queue;
beyond that a 429
with ``Retry-After`` comes back at once. A client that disconnects, while queued or mid-answer,
has its generation cancelled. ``shut_down(app)`` (``serve`` on Ctrl+C / SIGTERM) answers new and
queued requests with a 503, lets the running ones finish for a grace period, then ends the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from functools import cache
from importlib.resources import files
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..engine import CheckedRequest, EnsembleEngine
from ..errors import (
    ContextLengthError,
    EngineClosedError,
    InvalidParametersError,
    InvalidRequestError,
    MemberError,
)
from ..events import Event
from ..options import DEFAULT_MAX_ACTIVE
from .admission import Admission, Overloaded, Ticket
from .completions import MemberUnavailable, collect, collect_text, stream_chunks
from .openai_schema import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorBody,
    ErrorDetail,
    ModelCard,
    ModelList,
    completion_id,
    text_completion_id,
)
from .sse import ClientGone, EventStreamResponse, cancel_on_disconnect

MAX_BODY_BYTES = 1 << 20
log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answered as OpenAI does: HTTP status plus ``{"error": {...}}``."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.headers = status, headers
        self.detail = ErrorDetail(message=message, type=type, param=param, code=code)

    def response(self) -> JSONResponse:
        return JSONResponse(ErrorBody(error=self.detail).model_dump(), self.status, headers=self.headers)


def _engine_error(err: InvalidRequestError, prompt_field: str = "messages", answer_field: str | None = None
                  ) -> ApiError:
    """``answer_field``: the request's field that set the answer's length (``max_tokens`` or
    ``max_completion_tokens``), named where the engine's message says ``max_new_tokens``, which the
    client never sent; where that length alone fills a window, it is the field to change."""
    if isinstance(err, ContextLengthError):
        message = str(err)
        if answer_field is not None:
            message = message.replace("max_new_tokens (", f"{answer_field} (")
        param = answer_field if answer_field is not None and message.startswith(answer_field) else prompt_field
        return ApiError(400, message, param=param, code="context_length_exceeded")
    message = str(err)
    if isinstance(err, InvalidParametersError) and err.kind is not None:
        # param and code from the same (first) problem, by its type: read from the message's text, a value
        # holding ': Field required' flipped the code, and with two problems they came from different ones
        return ApiError(400, message, param=err.loc or _param_of(message), code=_code_of(err.kind))
    # the engine's own checks ("tool_choice 'g' is not ..."): a value the request sent that cannot be served
    return ApiError(400, message, param=_param_of(message), code="invalid_value")


async def _check_fit(engine: EnsembleEngine, prompts: list[str], params: dict[str, Any]) -> None:
    """Every prompt of a list leaves each member room for the answer, checked before the first is answered.
    The error names the prompt that does not fit, but not where the answer's length alone fills a member's
    window: then no prompt would fit, and 'prompt 0 of the list: max_tokens ... alone fills' blamed the first
    (and made the error's param 'prompt', not the length to lower)."""
    for index, prompt in enumerate(prompts):
        try:
            await engine.acheck_fits(prompt, **params)
        except ContextLengthError as err:
            if _answer_fills_a_window(engine, params):
                raise
            raise ContextLengthError(f"prompt {index} of the list: {err}") from None


def _answer_fills_a_window(engine: EnsembleEngine, params: dict[str, Any]) -> bool:
    """Whether the answer length asked (the request's, else one set in the engine's constructor) fills the
    smallest member's window alone, so that no prompt could fit (the members are loaded: a check ran)."""
    options = engine.options
    asked = params.get("max_new_tokens", options.max_new_tokens if "max_new_tokens" in options.model_fields_set
                       else None)
    return asked is not None and asked >= engine.context_window


def _unavailable(err: MemberError) -> MemberUnavailable:
    """Log the member's failure on one line, URL included (the operator's lead), and return what the client
    is told; no traceback: the failure is the backend's, not the server's."""
    log.error("member %r at %s failed: %s", err.member, _URL_CREDENTIALS.sub("//", err.url), err.reason)
    reason = _URL.sub("<a URL>", err.reason.replace(err.url, "<its URL>") if err.url else err.reason)
    host = urlsplit(err.url).hostname if err.url else None
    if host:  # bare, in a backend's own words ("Server at llm-b.internal Port 8081"); as a whole name, not
        # inside a word or a placeholder (a host "a" or "its" made "see <<its host> URL>", "d<its host>t")
        reason = re.sub(rf"(?<![\w.<-]){re.escape(host)}(?![\w-]|\.\w)", "<its host>", reason)
    if len(reason) > REASON_CHARS:  # a backend's error page, echoed: the log keeps it whole
        cut = reason[:REASON_CHARS]
        opened = cut.rfind("<")
        if opened > cut.rfind(">") and reason.startswith(_PLACEHOLDERS, opened):  # "see <its UR…" read as
            cut = cut[:opened]  # a broken address: a placeholder is told whole or not at all
        reason = cut.rstrip() + "…"
    return MemberUnavailable(f"member {err.member!r} is unavailable: {reason}")


_PLACEHOLDERS = ("<its URL>", "<a URL>", "<its host>")
"""What ``_unavailable`` puts where a member's reason named an address."""

REASON_CHARS = 240
"""The most characters of a member's failure the client is told: the reason echoes the backend's answer
(an HTML error page, a proxy's), which is the operator's to read in the log, not the client's."""


_URL = re.compile(r"(?:\b[a-z][a-z0-9+.-]*:)?//[^\s'\"<>)]+", re.IGNORECASE)
"""Any address in a member's reason (a redirect's target, protocol-relative or not, the server root a hint
names, a backend's own words): internal addresses the client is not told."""
_URL_CREDENTIALS = re.compile(r"//[^/@\s]*@")


def _member_error(err: MemberUnavailable) -> ApiError:
    """A 502, as a gateway whose upstream failed: the request may be retried."""
    return ApiError(502, str(err), type="server_error", code="member_unavailable")


def _shutting_down(err: EngineClosedError) -> ApiError:
    """A request refused or cut short because the server is shutting down (the engine closed). With
    ``Retry-After``, as the 429: without it, the openai client's retries came back within about a second and
    gave up while a restarted server (or another replica behind a balancer) was still coming up."""
    return ApiError(503, f"{err}; retry later", type="server_error", code="server_shutting_down",
                    headers={"Retry-After": "5"})


def _validation_error(err: ValidationError, body: Any = None) -> ApiError:
    """A 400 naming the request field at fault. pydantic's location also names the branch it tried of a
    field that takes several types ('messages.0.content.str', 'ensemble_events.bool'), which is no field
    of the request: the location is cut to what the body holds, and the branches' messages are joined."""
    errors = err.errors()
    paths = [_body_path(error["loc"], body, error["type"]) for error in errors]
    # the branch that got furthest into the body is the one the client meant ('content': [{"text": 3}]
    # failed as a string too); the other branches' errors at a field above it are not counted again. At
    # one depth a misspelt key comes first: it explains the field missing beside it ('functions')
    first = max(range(len(errors)),
                key=lambda index: (len(paths[index].split(".")), errors[index]["type"] == "extra_forbidden"))
    param = paths[first] or None
    code = _code_of(errors[first]["type"])
    same = [error["msg"] for error, path in zip(errors, paths, strict=True) if path == paths[first]]
    text = same[0] + "".join(f", or {_without(msg, 'Input should be ')}" for msg in dict.fromkeys(same[1:]))
    message = f"{param}: {text}" if param else text
    if code == "unknown_parameter" and param:  # OpenAI's words, with its path ('messages[0].toolCalls')
        message = f"Unknown parameter: '{_openai_path(param)}'."
    others = sum(path != paths[first] and not paths[first].startswith(f"{path}.") for path in paths)
    if others:
        message += f" (and {others} more problem{'s' if others > 1 else ''})"
    return ApiError(400, message, param=param, code=code)


def _code_of(kind: str) -> str:
    """The OpenAI error code of a pydantic error type, for the request's and the engine's validation alike."""
    return ("missing_required_parameter" if kind == "missing" else "unknown_parameter" if kind == "extra_forbidden" else
            "invalid_type" if kind.endswith("_type") else "invalid_value")


def _openai_path(path: str) -> str:
    """'messages.0.tool_calls.1.id' as OpenAI's messages write it: 'messages[0].tool_calls[1].id'."""
    return re.sub(r"\.(\d+)(?=\.|$)", r"[\1]", path)


def _body_path(loc: tuple[int | str, ...], body: Any, kind: str) -> str:
    """The part of a pydantic location that names fields and indices of the request body: a union's branch
    name ('str', 'list[...]', a tag) is skipped; a missing field's name is kept."""
    if body is None:
        return ".".join(map(str, loc))
    kept: list[str] = []
    node = body
    for index, part in enumerate(loc):
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif not (kind == "missing" and index == len(loc) - 1):
            continue
        kept.append(str(part))
    return ".".join(kept)


def _without(text: str, prefix: str) -> str:
    return text[len(prefix):] if text.startswith(prefix) else text


def _too_large() -> ApiError:
    return ApiError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", code="request_too_large")


async def _read_body(request: Request) -> bytes:
    """The body, refused with a 413 once past ``MAX_BODY_BYTES``: read as it arrives, so that a
    chunked body (no Content-Length) is cut off at the limit, not buffered whole first."""
    if int(request.headers.get("content-length") or 0) > MAX_BODY_BYTES:
        raise _too_large()
    raw = bytearray()
    async for part in request.stream():
        raw += part
        if len(raw) > MAX_BODY_BYTES:
            raise _too_large()
    return bytes(raw)


def _param_of(message: str) -> str | None:
    """The request field an engine error names, so that the 400 says which ``param`` was wrong, as
    OpenAI's do: ``options.validated``'s "invalid parameters: <field>: ...", or a message that
    starts with a field's name ("tool_choice 'g' is not ...")."""
    if match := re.match(r"invalid parameters: ([A-Za-z_][\w.]*): ", message):
        return match.group(1)
    first = re.match(r"\w+", message)
    fields = ChatCompletionRequest.model_fields.keys() | CompletionRequest.model_fields.keys()
    return first.group(0) if first and first.group(0) in fields else None


RequestT = TypeVar("RequestT", ChatCompletionRequest, CompletionRequest)


async def _parse(request: Request, kind: type[RequestT]) -> RequestT:
    """The request body as a validated ``kind``, or an ``ApiError`` saying why not."""
    raw = await _read_body(request)
    try:
        return _validated_request(raw, kind)
    except RecursionError:  # json's and pydantic's nesting limits
        raise ApiError(400, "the request body is not valid JSON: nested too deeply", code="invalid_json") from None


def _validated_request(raw: bytes, kind: type[RequestT]) -> RequestT:
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ApiError(400, f"the request body is not valid UTF-8 ({err.reason} at byte {err.start})",
                       code="invalid_encoding") from None
    except json.JSONDecodeError as err:
        raise ApiError(400, f"the request body is not valid JSON: {err}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {type(body).__name__}",
                       code="invalid_type")
    try:
        # JSON's "\ud800" escapes decode to lone surrogates, which are not text: refused here once,
        # wherever they stand (a tool's description, a call's arguments, a schema's keys, the model).
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as err:
        raise ApiError(400, f"the request body is not valid Unicode: {err.reason} (a lone surrogate escape)",
                       code="invalid_encoding") from None
    try:
        return kind.model_validate(body)
    except ValidationError as err:
        raise _validation_error(err, body) from None


async def _events(engine: EnsembleEngine, ticket: Ticket, messages: str | CheckedRequest,
                  params: dict[str, Any]) -> AsyncGenerator[Event, None]:
    """The engine's event stream for one request, run while holding an admission slot."""
    try:
        async with ticket, aclosing(engine.astream(messages, **params)) as stream:
            async for event in stream:
                yield event
    except MemberError as err:  # a stream already started reports str(err) in-stream: without the URL
        raise _unavailable(err) from None
    finally:
        ticket.close()


async def _first(events: AsyncIterator[Event]) -> Event:
    return await anext(events)


async def _prepend(first: Event, rest: AsyncGenerator[Event, None]) -> AsyncGenerator[Event, None]:
    async with aclosing(rest):
        yield first
        async for event in rest:
            yield event


async def shut_down(app: Starlette, grace_s: float, hurry: Callable[[], bool] = lambda: False) -> None:
    """Stop serving before the server stops: new and queued requests get a 503 at once, the running
    ones get ``grace_s`` seconds to finish, then the engine is closed, which ends those still
    running as cancelled (a stream sends its final chunk, an error saying it was cut short, and
    ``[DONE]``; a whole answer is a 503). ``hurry()`` true (a second Ctrl+C) stops the waiting.
    Without this, uvicorn cancels the request tasks after its grace: streams cut mid-chunk."""
    admission: Admission = app.state.admission
    admission.close()
    deadline = time.monotonic() + grace_s
    while admission.load().active + admission.load().waiting and time.monotonic() < deadline and not hurry():
        await asyncio.sleep(0.05)
    closing = asyncio.ensure_future(app.state.engine.aclose())
    while not closing.done() and not hurry():
        await asyncio.sleep(0.05)


@cache
def _page() -> str:
    return files(__package__).joinpath("static/index.html").read_text(encoding="utf-8")


class QuietForcedShutdown:
    """A request still running when a second Ctrl+C forces the server down is cancelled as the process
    exits (asyncio.run cancels what is left), and uvicorn logged that CancelledError as an 'Exception in
    ASGI application' traceback, though nothing failed: its client is cut off, as it is told to expect.
    Once shutting down, such a cancellation ends the request with one line instead, and a response already
    started is ended (uvicorn otherwise logged 'ASGI callable returned without completing response')."""

    def __init__(self, app: ASGIApp, admission: Admission) -> None:
        self.app, self.admission = app, admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = {"started": False, "ended": False}

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["ended"] = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except asyncio.CancelledError:
            if scope["type"] != "http" or not self.admission.closed:
                raise
            log.info("%s %s cut off at shutdown", scope.get("method", ""), route_path(scope))
            if state["started"] and not state["ended"]:
                with contextlib.suppress(Exception):  # the connection may be gone already
                    await send({"type": "http.response.body", "body": b"", "more_body": False})


OPEN_PATHS = frozenset({"/", "/health"})
"""The routes an API key does not guard: the live page and the health check."""


def route_path(scope: Scope) -> str:
    """The path the app routes on: ``scope["path"]`` less the ``root_path`` it is served under
    (mounted under a prefix, or behind a proxy with ``--root-path``: both keep the prefix in the path)."""
    path, root = scope["path"], scope.get("root_path", "")
    return (path[len(root):] or "/") if root and path.startswith(root) else path


class ApiKeyGuard:
    """ASGI middleware: every request but the page and ``/health`` must carry ``Authorization:
    Bearer <api_key>`` — decided on the path the app routes on, so that mounting the app under a
    prefix or serving it behind a proxy's root path cannot open the ``/v1`` routes."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and route_path(scope) not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                message = ("Incorrect API key provided." if given else
                           "You didn't provide an API key: send 'Authorization: Bearer <key>'.")
                await ApiError(401, message, code="invalid_api_key").response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(engine: EnsembleEngine, *, model_name: str | None = None, max_active: int = DEFAULT_MAX_ACTIVE,
               max_waiting: int = 16, api_key: str | None = None,
               allowed_origins: Sequence[str] = ()) -> Starlette:
    """An ASGI app serving ``engine`` under ``model_name`` (default ``"<method>-ensemble"``).

    ``max_active`` requests generate at once (``serve --max-active`` also gives the in-process
    llama.cpp members that many slots, one per active request); ``max_waiting`` more wait in a
    queue; any further request gets a 429. ``api_key``: required on every route
    but the page and ``/health`` (``ApiKeyGuard``). ``allowed_origins``: the web pages (``https://app.example``,
    or ``*``) whose scripts may call this server from a browser (CORS, as vLLM's ``--allowed-origins``);
    none by default, so only the server's own page can (the browser's same-origin rule)."""
    name = model_name or f"{engine.options.method}-ensemble"
    admission = Admission(max_active, max_waiting)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await asyncio.to_thread(lambda: engine.members)  # load weights before serving
        yield

    def members() -> list[str]:
        return engine.labels

    async def health(request: Request) -> JSONResponse:
        # "auto": SAFE chooses per request (each answer's stats name it); else the first member drafts
        drafter = "auto" if engine.options.drafter == "auto" else members()[0]
        return JSONResponse({"status": "ok", "model": name, "method": engine.options.method,
                             "members": members(), "drafter": drafter, "load": admission.load().model_dump()})

    def card() -> ModelCard:
        return ModelCard(id=name, created=created, method=engine.options.method, members=members())

    def unknown_model(model: str) -> ApiError:
        return ApiError(404, f"The model `{model}` does not exist; this server serves `{name}` (GET /v1/models)",
                        param="model", code="model_not_found")

    async def models(request: Request) -> JSONResponse:
        return JSONResponse(ModelList(data=[card()]).model_dump())

    async def model(request: Request) -> JSONResponse:
        """``GET /v1/models/{id}`` (``client.models.retrieve``): the card, or OpenAI's 404."""
        if request.path_params["model_id"] != name:
            raise unknown_model(request.path_params["model_id"])
        return JSONResponse(card().model_dump())

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(_page())

    def check(req: ChatCompletionRequest | CompletionRequest) -> None:
        """What both endpoints refuse before any work: another model, a feature not honoured, a conflict."""
        if req.model != name:
            raise unknown_model(req.model)
        if problem := req.unsupported():
            raise ApiError(400, f"{problem[0]}: {problem[1]}", param=problem[0], code="unsupported_parameter")
        if isinstance(req, ChatCompletionRequest) and (field := req.missing()):
            raise ApiError(400, f"{field}: Field required", param=field, code="missing_required_parameter")
        if problem := req.conflict():
            raise ApiError(400, f"{problem[0]}: {problem[1]}", param=problem[0], code="invalid_value")

    def admit() -> Ticket:
        try:
            return admission.admit()
        except Overloaded as err:  # OpenAI's code (its SDK's error types name it); the type as before
            raise ApiError(429, f"the server is busy: {err}", type="rate_limit_error",
                           code="rate_limit_exceeded", headers={"Retry-After": "1"}) from None

    async def respond(request: Request, req: ChatCompletionRequest | CompletionRequest, ticket: Ticket,
                      events: AsyncGenerator[Event, None] | None, whole: Callable[[], Awaitable[BaseModel]],
                      chunks: Callable[[AsyncGenerator[Event, None]], AsyncIterator[str]]) -> Response:
        """The response of an admitted request: ``whole()`` answered at once, or ``chunks`` of
        ``events`` (given when ``req.stream``) streamed."""
        started = False
        try:
            if not req.stream:
                result = await cancel_on_disconnect(request.receive, whole())
                # pydantic's JSON, as the stream's: a non-finite float (a -inf logprob) is null, not an HTTP 500
                return Response(result.model_dump_json(), media_type="application/json")  # OpenAI's nulls kept
            assert events is not None, "a streamed request has its events"
            # Wait for a slot and the first event before answering 200, so that a request the
            # engine rejects (e.g. too long for a member's context) still gets a proper 400.
            first = await cancel_on_disconnect(request.receive, _first(events))
            started = True
        except InvalidRequestError as err:
            raise _engine_error(err, "prompt" if isinstance(req, CompletionRequest) else "messages",
                                req.answer_tokens_field()) from None
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; the work was cancelled
        finally:
            if not started:
                if events is not None:
                    await events.aclose()
                ticket.close()
        return EventStreamResponse(chunks(_prepend(first, events)), on_close=ticket.close)

    async def chat_completions(request: Request) -> Response:
        req = await _parse(request, ChatCompletionRequest)
        check(req)
        messages = [m.as_engine_message() for m in req.messages]
        try:  # the engine's own check (a tool list's schemas on its schema pool), once: astream serves it as checked
            checked = await engine.acheck_request(messages, **{**req.generation_params(), **req.output_options()})
        except InvalidRequestError as err:
            raise _engine_error(err, "messages", req.answer_tokens_field()) from None
        except RecursionError:  # e.g. a JSON schema nested past what the engine's readers recurse through
            raise ApiError(400, "the request is nested too deeply to be read", code="invalid_value") from None
        ticket = admit()
        cid = completion_id()
        events = _events(engine, ticket, checked, {})
        return await respond(
            request, req, ticket, events,
            lambda: collect(events, completion_id=cid, model=name, method=engine.options.method, members=members(),
                            ensemble_events=req.ensemble_events),
            lambda stream: stream_chunks(
                stream, completion_id=cid, model=name, ensemble_events=req.ensemble_events,
                include_usage=bool(req.stream_options and req.stream_options.include_usage)))

    async def completions(request: Request) -> Response:
        """``POST /v1/completions``: each prompt is text the answer continues (the engine's ``raw_prompt``)."""
        req = await _parse(request, CompletionRequest)
        check(req)
        params = {**req.generation_params(), "raw_prompt": True}
        listed = len(req.prompts) > 1
        checked: list[CheckedRequest] = []
        closed: EngineClosedError | None = None
        for index, prompt in enumerate(req.prompts):  # the engine's own check, as chat's: astream serves it
            try:  # as checked. The parameters are checked before the text: bad ones fail at prompt 0
                checked.append(await engine.acheck_request(prompt, **params))
            except EngineClosedError as err:  # prompt i servable, the engine closed: a later bad prompt is
                closed = closed or err        # still the 400 (a 503 'retry later' would fail the same way)
            except InvalidParametersError as err:
                raise _engine_error(err, "prompt", req.answer_tokens_field()) from None
            except InvalidRequestError as err:  # the prompt's own text (empty, unencodable)
                raise ApiError(400, f"{err} (prompt {index} of the list)" if listed else str(err),
                               param="prompt", code="invalid_value") from None
        if closed is not None:
            raise closed
        ticket = admit()
        cid = text_completion_id()
        events = _events(engine, ticket, checked[0], {}) if req.stream else None  # one prompt (check)
        echoes = req.prompts if req.echo else [""] * len(req.prompts)

        async def whole() -> BaseModel:
            try:  # the prompts one after another, on this request's one admission slot
                async with ticket:
                    if listed:  # a later prompt too long for a member must not throw the earlier answers away
                        await _check_fit(engine, req.prompts, params)
                    return await collect_text([engine.astream(c) for c in checked], completion_id=cid,
                                              model=name, method=engine.options.method, members=members(),
                                              ensemble_events=req.ensemble_events, echoes=echoes)
            finally:
                ticket.close()

        return await respond(
            request, req, ticket, events, whole,
            lambda stream: stream_chunks(
                stream, completion_id=cid, model=name, ensemble_events=req.ensemble_events, shape="text",
                echo=echoes[0], include_usage=bool(req.stream_options and req.stream_options.include_usage)))

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found" if exc.status_code == 404 else "method_not_allowed" if exc.status_code == 405 else None
        return ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                        code=kind, headers=exc.headers).response()

    async def closed_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, EngineClosedError)
        return _shutting_down(exc).response()

    async def member_error(request: Request, exc: Exception) -> Response:
        """A member's backend failed: a 502 naming the member, logged once with its URL. As the catch-all
        500 it was the URL in the answer and an 'Exception in ASGI application' traceback in the log."""
        assert isinstance(exc, MemberError | MemberUnavailable)
        return _member_error(_unavailable(exc) if isinstance(exc, MemberError) else exc).response()

    async def server_error(request: Request, exc: Exception) -> Response:
        return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error").response()

    routes = [
        Route("/", page, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
    # CORS outside the key guard: a browser's preflight (OPTIONS) carries no Authorization header. Any request
    # header an allowed origin asks for (as vLLM): the official SDKs send X-Stainless-* headers with every
    # request, and a preflight naming them was refused (400), so a web app on the openai JS client could not call
    cors = [Middleware(CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["GET", "POST"],
                       allow_headers=["*"], max_age=600)] if allowed_origins else []
    guard = [Middleware(ApiKeyGuard, api_key=api_key)] if api_key else []
    quiet = [Middleware(QuietForcedShutdown, admission=admission)]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=quiet + cors + guard,
                    exception_handlers={ApiError: api_error, HTTPException: http_error, EngineClosedError: closed_error,
                                        MemberError: member_error, MemberUnavailable: member_error,
                                        Exception: server_error})
    app.state.engine, app.state.admission, app.state.model_name = engine, admission, name
    return app
