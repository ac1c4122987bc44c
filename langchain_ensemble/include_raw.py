"""``with_structured_output(..., include_raw=True)``: ``{"raw", "parsed", "parsing_error"}`` in every mode.

LangChain's pattern (``RunnableMap(raw=llm) | parse.with_fallbacks([...], exception_key="parsing_error")``,
ChatOpenAI's too) fills ``parsing_error`` for ``invoke`` only: ``with_fallbacks`` catches a stream's error
only before its first chunk, and this package's parsers check the whole answer at the stream's end (a
call cut or unreadable, arguments failing the pydantic model, JSON the engine marked invalid), so
``stream``/``astream`` raised after the ``{"raw": ...}`` chunks where ``invoke`` gave the error in the dict.
Here the raw chunks pass through and the whole answer is parsed once at the end, its error handed back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig, RunnableGenerator
from langchain_core.runnables.utils import AddableDict


def with_raw(llm: Runnable[Any, Any], parser: Runnable[Any, Any]) -> Runnable[Any, Any]:
    """``llm`` then ``{"raw": chunk}`` per chunk and one ``{"parsed", "parsing_error"}`` chunk: AddableDicts
    that merge into what ``invoke`` gives (the same code: ``invoke`` runs this over its one message). The
    parse runs once, on the whole answer, so ``parsed`` is never a partial object that a failure at the end
    could not take back (merging keeps a value over a later None). An error of ``llm`` itself (a closed
    engine, a member failure) still raises: only the parse's error is ``parsing_error``, as in ``invoke``."""

    def transform(chunks: Iterator[Any], config: RunnableConfig | None = None) -> Iterator[AddableDict]:
        raw = None
        for chunk in chunks:
            raw = chunk if raw is None else raw + chunk
            yield AddableDict(raw=chunk)
        yield _parsed(lambda: parser.invoke(raw, config))

    async def atransform(chunks: AsyncIterator[Any], config: RunnableConfig | None = None
                         ) -> AsyncIterator[AddableDict]:
        raw = None
        async for chunk in chunks:
            raw = chunk if raw is None else raw + chunk
            yield AddableDict(raw=chunk)
        try:
            parsed = await parser.ainvoke(raw, config)
        except Exception as error:  # what with_fallbacks(exception_key=...) hands back in invoke
            yield AddableDict(parsed=None, parsing_error=error)
        else:
            yield AddableDict(parsed=parsed, parsing_error=None)

    return llm | RunnableGenerator(transform, atransform, name="structured_output_with_raw")


def _parsed(parse: Callable[[], Any]) -> AddableDict:
    """The parse's result, or its error as ``parsing_error`` with ``parsed`` None."""
    try:
        return AddableDict(parsed=parse(), parsing_error=None)
    except Exception as error:  # what with_fallbacks(exception_key=...) hands back in invoke
        return AddableDict(parsed=None, parsing_error=error)
