"""A 400's ``param`` names a field of the request, never pydantic's name for the branch of a union it
tried: 'messages.0.content.str' and 'ensemble_events.bool' pointed a client's field highlighting at
nothing (hunt 2026-12-07c)."""
from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from shared_engine.server.app import _validation_error
from shared_engine.server.openai_schema import ChatCompletionRequest

USER = [{"role": "user", "content": "hi"}]


def error_for(body: dict[str, Any]) -> tuple[str, str | None, str]:
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate(body)
    detail = _validation_error(caught.value, body).detail
    return detail.message, detail.param, detail.code


@pytest.mark.parametrize(("body", "param", "message"), [
    ({"model": "m", "messages": [{"role": "user", "content": 5}]},
     "messages.0.content", "messages.0.content: Input should be a valid string, or a valid list"),
    ({"model": "m", "messages": USER, "ensemble_events": "bogus"},
     "ensemble_events", "ensemble_events: Input should be a valid boolean, or 'all'"),
    # the list branch got furthest: the string branch's error at 'content' is not the one to show
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
     "messages.0.content.0.text", "messages.0.content.0.text: Input should be a valid string"),
])
def test_param_is_a_field_of_the_request(body: dict[str, Any], param: str, message: str) -> None:
    got_message, got_param, code = error_for(body)
    assert (got_param, got_message, code) == (param, message, "invalid_type")


def test_a_missing_field_keeps_its_name_and_other_problems_are_counted() -> None:
    assert error_for({"model": "m", "messages": [{"content": "hi"}]})[:2] == (
        "messages.0.role: Field required", "messages.0.role")
    message, param, code = error_for({"model": "m", "messages": [{"role": "user", "content": {"a": 1}}],
                                      "temperature": "hot"})
    assert param == "messages.0.content" and message.endswith("(and 1 more problem)"), message
    assert error_for({"messages": USER, "top_p": [1]}) == (
        "model: Field required (and 1 more problem)", "model", "missing_required_parameter")
