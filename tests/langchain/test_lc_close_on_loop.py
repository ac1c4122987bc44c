"""``llm.close()`` (or a collection) of the last chat model closes its engine; in an async app that ran
on the event loop's thread, where a llama.cpp member's close waits for the call a cancelled request left
running in its server (seconds), and every coroutine froze that long."""
from __future__ import annotations

import asyncio
import contextlib

from langchain_ensemble import ChatEnsemble
from shared_engine.members import register_member, unregister_member
from tests.loop_watch import loop_gaps
from tests.test_llamacpp_lifecycle import in_process
from tests.test_llamacpp_slots import PROMPTS


def test_closing_the_last_chat_model_on_an_event_loop_does_not_freeze_it() -> None:
    with in_process(delay_s=1.0) as (member, stand_in, server):
        register_member(member, "toy-lc-in-process")
        llm = ChatEnsemble(models=["toy-lc-in-process"], method="single", max_tokens=8)

        async def run() -> float:
            async with loop_gaps() as gaps:
                call = asyncio.create_task(llm.ainvoke(PROMPTS[0]))
                while not stand_in.slot_of_call:  # a call is running in the server
                    await asyncio.sleep(0.005)
                call.cancel()  # its call goes on in its thread
                with contextlib.suppress(asyncio.CancelledError):
                    await call
                unregister_member("toy-lc-in-process")  # the engine's hold is the last one
                llm.close()  # sync, on the loop's thread (a shutdown hook written sync)
                while not server.running_at_close:  # the member is closed, off the loop
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.05)  # the next tick records a freeze, if any
            return max(gaps)

        frozen = asyncio.run(run())
        assert server.running_at_close == [0]  # its close waited for the call
        assert frozen < 0.5, f"the event loop was frozen {frozen:.2f} s"
