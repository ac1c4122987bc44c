"""Admission control on its own: the 429's message and the shutdown refusal (no server, no models)."""

from __future__ import annotations

import pytest

from shared_engine.server.admission import Admission, Overloaded


async def test_the_overload_message_counts_admitted_requests_about_to_run_as_running() -> None:
    """Four requests admitted at once under limits 2 + 2, one already holding its slot: the 429 said
    "1 requests running and 3 waiting (limits 2 + 2)", though only two of them would ever wait."""
    admission = Admission(max_active=2, max_waiting=2)
    tickets = [admission.admit() for _ in range(4)]
    await tickets[0].__aenter__()
    with pytest.raises(Overloaded) as refused:
        admission.admit()
    assert str(refused.value) == "its 2 running and 2 waiting places are all taken; retry later"
    for ticket in tickets:
        ticket.close()
    assert admission.load().active == admission.load().waiting == 0
