"""Behaviour the last session's changes left unpinned (mutation testing of 12e38a5..6978ed4): each test
fails on one mutant of the code it names and passes on the code as it is. Toy members, scripted answers
and pure functions only, so the file stays fast."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import torch

from shared_engine.alignment import TokenTable
from shared_engine.decoding.round import FusionSettings, _fuse
from shared_engine.events import Event, FinishEvent, Stats, TokenEvent, Usage
from shared_engine.fusion import MemberDist, make_fuser
from shared_engine.options import GenerationParams
from shared_engine.sampling import Sampler
from shared_engine.tools import OutputOptions, OutputPlan
from tests.test_server_tools import ScriptedDecoding
from tests.test_structured_retry import MULTIPLY, PRODUCT
from tests.toy import toy_member

JSON = {"type": "json_object"}


class Finishing(ScriptedDecoding):
    """Scripted answers whose finish carries ``finish`` (a stop string, a failed member) as decoding's would."""

    def __init__(self, answers: list[str], **finish: Any) -> None:
        super().__init__(answers)
        self.finish = finish

    async def _decode(self, messages: list[dict[str, Any]], plan: OutputPlan,
                      gen: GenerationParams) -> AsyncGenerator[Event, None]:
        self.prompts.append((messages, plan))
        text = self.answers[min(len(self.prompts), len(self.answers)) - 1]
        yield TokenEvent(text=text, source="draft", position=0)
        yield FinishEvent(text=text, stats=Stats(prompt_tokens=5, tokens=3), **{"reason": "eos", **self.finish})


def test_an_answer_cut_by_its_own_stop_string_is_not_asked_again() -> None:
    """engine.py: a JSON answer the request's stop string cut ended as asked; a retry would be cut there
    too (and cost a whole attempt more), so its format_error stands without a retry."""
    engine = Finishing(['"a": 1', '"a": 2}'], reason="stop", stop_string="END")
    result = engine.generate("Check.", response_format=JSON, stop=["END"])
    assert len(engine.prompts) == 1 and not result.rejected_attempts
    assert result.stop_string == "END" and result.format_error is not None
    retried = Finishing(['"a": 1', '"a": 2}'])  # without a stop string: asked again, and valid then
    answer = retried.generate("Check.", response_format=JSON)
    assert len(retried.prompts) == 2 and answer.format_error is None and answer.text == '{"a": 2}'


def test_generate_passes_on_the_stop_string_and_the_failed_members() -> None:
    """GenerationResult: ``generate()`` callers read which stop string ended the answer and which members
    failed, as the finish event says (the adapters build their metadata from these)."""
    result = Finishing(["x"], reason="stop", stop_string="END", failed_members={"b": "timed out"}).generate(
        "Check.")
    assert result.stop_string == "END" and result.failed_members == {"b": "timed out"}


def test_usage_totals_every_attempt() -> None:
    """Usage.of_attempts: each field, the total too, is the sum over the request's attempts."""
    usage = Usage.of_attempts([Stats(prompt_tokens=5, tokens=3), Stats(prompt_tokens=7, tokens=2)])
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (12, 5, 17)
    engine = ScriptedDecoding(['"a": 1,, x', '"ok": true}'])
    result = engine.generate("Check.", response_format=JSON)
    assert result.usage.total_tokens == 2 * (5 + 3)


def test_a_retry_beside_tools_keeps_the_callers_own_prefix() -> None:
    """OutputPlan.answer_only: the answer-only plan is prefilled with "{" unless the caller gave its own
    prefix, which every attempt keeps."""
    own = OutputPlan(OutputOptions(tools=[MULTIPLY], response_format=PRODUCT, prefix='{"product": '))
    assert own.answer_only().prefix == '{"product": ' and own.answer_only().tools is None
    plain = OutputPlan(OutputOptions(tools=[MULTIPLY], response_format=PRODUCT))
    assert plain.prefix == "" and plain.answer_only().prefix == "{"
    assert OutputPlan(OutputOptions(response_format=PRODUCT)).answer_only().prefix == "{"


def test_a_conversation_of_system_turns_only_gets_the_instruction_last() -> None:
    """OutputPlan.messages beside tools: the JSON instruction goes before the first non-system turn, after
    every system turn where there is none."""
    plan = OutputPlan(OutputOptions(tools=[MULTIPLY], response_format=PRODUCT))
    asked = plan.messages([{"role": "system", "content": "Be brief."}])
    assert [m["content"] for m in asked][0] == "Be brief." and "call it first" in asked[-1]["content"]



def _logits(table: TokenTable, favour: dict[bytes, float]) -> torch.Tensor:
    row = torch.full((table.vocab_size,), -20.0)
    for piece, value in favour.items():
        row[table.token_id(piece)] = value
    return row


def test_where_only_parts_of_characters_have_a_score_the_drafted_token_stands() -> None:
    """round._fuse: the drafter finds only first bytes of characters plausible, so no whole candidate keeps
    a score; the drafted token stands (not a byte the drafter may never complete, nor the zero-score key
    an argmax over nothing but zeros lands on), greedy or sampled (a draw fell evenly among the zero-score
    candidates: tempering floors each score at 1e-12)."""
    bpe, sp = toy_member("toy-bpe", "byte_level").table, toy_member("toy-sp", "metaspace", seed=1).table
    dists = [MemberDist("bpe", bpe, _logits(bpe, {b"\xe7": 9.0, b"\xe5": 8.5})),
             MemberDist("sp", sp, _logits(sp, {b" and": 6.0}))]
    settings = FusionSettings(make_fuser("unite", 10), None, plausibility=0.1)  # only the two bytes plausible
    drafted = bpe.token_id(b" and")
    assert drafted is not None
    for sampler in [Sampler(), *(Sampler(1.0, seed=seed) for seed in range(6))]:
        decision = _fuse(dists, torch.tensor([0.8, 0.2]), settings, sampler, 0, drafted, 0)
        assert decision.drafted == b" and" and decision.chosen == b" and"
