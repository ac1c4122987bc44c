"""Typed events streamed by the engine (pydantic, JSON-serialisable, stable ``type`` names).

A stream is: ``draft``/``verify``/``ensemble``/``adafuse``/``cache_sync`` events as decisions happen, a
``token`` event for every piece of committed text, a ``tool_call`` event for every tool call parsed
from the answer (tools offered; the call's markup never appears in ``token`` events),
``format_retry`` when a structured-output answer failed validation and is regenerated, and exactly
one ``finish`` event at the end. A structured-output answer's events come together after it was
validated (before its ``finish``), in their order; a rejected answer's never come. Concatenating
the ``text`` of all ``token`` events gives the answer (``finish.text``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import EngineClosedError


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True)


class TokenEvent(_Event):
    type: Literal["token"] = "token"
    text: str = Field(description="Text delta (complete UTF-8 characters only).")
    source: Literal["draft", "ensemble", "prefix"] = Field(
        description="'draft': a drafted token kept as is, including where fusion ran and kept it; "
                    "'ensemble': fusion changed the drafted token here (AdaFuse: a span the members voted "
                    "on); 'prefix': the answer prefix the caller gave (prefill), which the members "
                    "continued. Where fusion ran is counted by the stats' ensembled_tokens and shown by the "
                    "'ensemble' events (every-token fuses every position, yet its tokens read 'draft' "
                    "wherever fusion kept the draft).")
    position: int = Field(description="Index of this token in the answer (drafter tokens).")


class DraftEvent(_Event):
    type: Literal["draft"] = "draft"
    member: str
    tokens: list[str] = Field(description="Drafted token texts (bytes decoded leniently).")
    token_ids: list[int]


class VerifiedPosition(BaseModel):
    offset: int = Field(description="Byte offset in the answer before the drafted token.")
    boundary_ok: bool = Field(description="Every member has a token boundary here.")
    consensus: bool | None = Field(None, description="Members agree (None: not checked).")
    probs: dict[str, float] = Field(default_factory=dict,
                                    description="Each member's probability of its own next token (at a "
                                                "position the drafter's confidence decides, the drafter's "
                                                "only: the verifiers' rows there are not asked for).")


class VerifyEvent(_Event):
    type: Literal["verify"] = "verify"
    positions: list[VerifiedPosition]


class Candidate(BaseModel):
    text: str = Field(description="The candidate as text ('<eos>' for ending the answer; bytes that are "
                                  "no whole character read as '\ufffd': see ``hex``).")
    member_probs: dict[str, float]
    fused: float
    hex: str | None = Field(None, description="The candidate's bytes in hex where they are not whole UTF-8 "
                                              "characters (several such candidates all read '\ufffd').")


class EnsembleEvent(_Event):
    type: Literal["ensemble"] = "ensemble"
    position: int = Field(description="Index in the answer (drafter tokens) of the fused token.")
    offset: int = Field(description="Byte offset in the answer where the fused token starts.")
    candidates: list[Candidate]
    sharpened: bool
    chosen: str
    chosen_index: int | None = Field(None, description="Index in ``candidates`` of the chosen one (None "
                                                       "where it is not among those listed).")
    drafted: str | None = Field(None, description="What the drafter had proposed here, if anything.")
    changed: bool = Field(description="The fused choice differs from the drafted token.")


class SpanCandidate(BaseModel):
    text: str = Field(description="The candidate span ('<eos>' for ending the answer; a span that "
                                  "ends it has '<eos>' after its text).")
    proposed_by: list[str] = Field(description="Members whose continuations gave this span.")
    member_nll: dict[str, float] = Field(description="Mean token NLL of the span under each member.")
    score: float = Field(description="Weighted mean of member_nll; the lowest wins.")
    hex: str | None = Field(None, description="The span's bytes in hex where they are not whole UTF-8 "
                                              "characters.")


class AdaFuseEvent(_Event):
    """One AdaFuse decision: a confident member's span, or a span voted on by every member."""

    type: Literal["adafuse"] = "adafuse"
    position: int = Field(description="Index in the answer (drafter tokens) where the span starts.")
    offset: int = Field(description="Byte offset in the answer where the span starts.")
    uncertainty: Literal["margin", "entropy"]
    member_uncertainty: dict[str, float] = Field(
        description="Each member's top-1 margin (higher = surer) or entropy in nats (lower = surer).")
    leader: str = Field(description="The most confident member.")
    fused: bool = Field(description="True: the members voted (test-time scaling); False: the "
                                    "leader was sure and its span was committed as is.")
    words: int = Field(description="Words in the committed span.")
    candidates: list[SpanCandidate]
    chosen: str
    chosen_index: int | None = Field(None, description="Index in ``candidates`` (best score first) of "
                                                       "the span committed.")


class CacheSyncEvent(_Event):
    type: Literal["cache_sync"] = "cache_sync"
    member: str
    kept: int
    dropped: int


class ToolCallEvent(_Event):
    """A tool call parsed from the answer. ``error`` set: a ``<tool_call>`` block that could not be
    read (``name``/``arguments`` None, ``raw`` holds it); reported, never guessed at."""

    type: Literal["tool_call"] = "tool_call"
    index: int = Field(description="0 for the answer's first call, 1 for the next, ...")
    id: str = Field(description="A fresh id ('call_...') to match the tool's result to the call.")
    name: str | None = None
    arguments: dict[str, Any] | None = None
    raw: str = Field("", description="The call's text as the members wrote it.")
    error: str | None = None
    tags: Literal["both", "open", "none"] = Field(
        "both", description="The tags the members wrote around ``raw``: both; the open tag only (the answer "
                            "ended first: the length cap, a stop string, a forced call's closing brace); "
                            "none (a bare JSON call). An unreadable call goes back as written, these tags with it.")

    @property
    def arguments_json(self) -> str:
        """The arguments as a JSON string (OpenAI's and LangChain's streamed form); the raw text
        for an unreadable call."""
        return self.raw if self.arguments is None else json.dumps(self.arguments, ensure_ascii=False)


class FormatRetryEvent(_Event):
    """A structured-output answer failed validation; the members are asked again (its text, calls
    and decisions were never released: the positions of the next answer's start from 0 again)."""

    type: Literal["format_retry"] = "format_retry"
    attempt: int = Field(description="The attempt that failed (1 = the first answer).")
    error: str
    text: str = Field(description="The rejected answer.")
    stats: Stats = Field(description="The rejected attempt's own statistics (finish.stats covers only "
                                     "the accepted, last attempt: add these for the whole cost).")


class Stats(BaseModel):
    prompt_tokens: int = 0
    tokens: int = Field(0, description="Answer tokens, counted in the drafter's vocabulary.")
    ensembled_tokens: int = Field(0, description="Positions where fusion ran.")
    changed_tokens: int = Field(0, description="Fusions whose choice differed from the draft.")
    ensemble_rate: float = 0.0
    drafted_tokens: int = 0
    accepted_tokens: int = Field(0, description="Drafted tokens committed unchanged.")
    chosen_tokens: int = Field(0, description="Tokens committed from a fused choice that differed "
                                              "from the draft (tokens == accepted + chosen).")
    rounds: int = 0
    draft_lengths: dict[int, int] = Field(
        default_factory=dict, description="Rounds by the draft length the schedule chose (draft_schedule: "
                                          "fixed, or adaptive); a draft may stop sooner: at EOS, the length cap "
                                          "or (adaptive) a token the drafter is unsure of.")
    unverified_rounds: int = Field(0, description="Rounds committed without the verifiers' forward: every "
                                                  "drafted token was at or above drafter_confidence, so "
                                                  "nothing there could be fused.")
    ahead_drafts: int = Field(0, description="overlap: drafts written for the next round while the verifiers "
                                             "scored this one.")
    ahead_drafts_used: int = Field(0, description="overlap: those the next round took (its round committed "
                                                  "whole); the others were stopped and thrown away.")
    spans: int = Field(0, description="AdaFuse: spans committed.")
    fused_spans: int = Field(0, description="AdaFuse: spans chosen by the members' vote.")
    forward_passes: dict[str, int] = Field(default_factory=dict)
    draft_s: float = Field(0.0, description="SAFE's rounds: seconds spent drafting (the drafter's forwards).")
    verify_s: float = Field(0.0, description="SAFE's rounds: seconds the verifiers' scoring took (run "
                                             "concurrently; what is left of elapsed_s is fusion, "
                                             "re-tokenization and bookkeeping).")
    time_to_first_token_s: float | None = None
    elapsed_s: float = 0.0
    tokens_per_s: float = 0.0
    member_weights: dict[str, float] = Field(
        default_factory=dict, description="The fusion weight each member had in this request (weights='auto' "
                                          "resolved), summing to 1.")
    loop_breaks: int = Field(0, description="Positions where the loop guard (repetition.py) kept a token that "
                                             "would have repeated the answer's end once more from being "
                                             "drafted or chosen by fusion.")
    turn_markers: int = Field(0, description="Positions where a plain-format member's turn marker (\"User\" of "
                                             "its stop string \"\\nUser:\" at a line start) held at least 1% "
                                             "of its mass and was read as its end of turn, or dropped at the "
                                             "answer's start (turn_markers.py).")
    constrained: bool = Field(False, description="response_format: the answer was decoded under the JSON "
                                                   "(schema) constraint (json_constraint.py); False: "
                                                   "validated and retried only.")
    drafter: str = Field("", description="The member that drafted (drafter='auto': chosen for this request).")
    answer_nll_per_byte: dict[str, float] = Field(
        default_factory=dict, description="drafter='auto': each member's NLL of the prompt's example answers, "
                                          "nats per byte (the lowest drafts); a member with no finite fit "
                                          "is left out.")
    drafter_choice_s: float = Field(0.0, description="drafter='auto': seconds spent choosing the drafter (the "
                                                     "members scoring the example answers; near 0 where "
                                                     "every fit was cached), part of time_to_first_token_s.")
    prompt_nll_per_byte: dict[str, float] = Field(
        default_factory=dict, description="weights='auto': each member's NLL of the prompt's content, "
                                          "nats per byte (lower = fits better); a member that could score "
                                          "none of it is left out.")


FormatRetryEvent.model_rebuild()


def mean_draft_length(lengths: Mapping[int, int] | Mapping[str, int]) -> float:
    """The mean length the draft schedule chose, from ``Stats.draft_lengths`` (rounds by length;
    summed over answers, or read back from JSON with string keys)."""
    rounds = sum(lengths.values())
    return round(sum(int(length) * n for length, n in lengths.items()) / rounds, 2) if rounds else 0.0


class FinishEvent(_Event):
    type: Literal["finish"] = "finish"
    reason: Literal["stop", "length", "eos", "cancelled", "error"]
    text: str = Field(description="The full answer.")
    stats: Stats
    failed_members: dict[str, str] = Field(
        default_factory=dict, description="Members dropped mid-answer (on_member_failure='degrade'): "
                                          "member -> the error.")
    tool_calls: list[ToolCallEvent] = Field(default_factory=list, description="Calls parsed from the answer.")
    format_error: str | None = Field(
        None, description="response_format given: why the last answer is still not the JSON asked for; a "
                          "forced tool call (tool_choice 'required' or a tool's name): why a call of the last "
                          "answer does not match its tool's parameter schema, or is not of the named tool.")
    stop_string: str | None = Field(
        None, description="The request's stop string that ended the answer (vLLM's stop_reason); None where "
                          "something else did (an end of turn, the length cap, a completed JSON answer).")
    rejected_attempts: list[Stats] = Field(
        default_factory=list, description="response_format given: the statistics of the earlier answers that "
                                          "failed validation and were asked again (``stats`` is the last one's).")

    @property
    def usage(self) -> Usage:
        """The tokens the whole request cost: every attempt's prompt and answer (a structured-output
        answer asked again reads its prompt again), as OpenAI, LangChain and LlamaIndex report usage."""
        return Usage.of_attempts([*self.rejected_attempts, self.stats])

    def raise_if_closed_mid_answer(self, model: str) -> None:
        """``EngineClosedError`` where the engine was closed while this answer ran (reason ``cancelled``,
        the only way a request gets it: a caller that cancels its own call never sees a finish). Its
        OpenAI reason is ``stop``, so a framework surface passing it on returned a cut answer that looks
        whole ('1, 2, 3,'); ChatOpenAI raises when its client is closed mid-request, and so do they.
        ``model`` names what was closed."""
        if self.reason == "cancelled":
            raise EngineClosedError(f"{model} was closed while this call ran; the partial answer is not an answer")

    @property
    def openai_finish_reason(self) -> OpenAIFinishReason:
        """The reason in OpenAI's vocabulary, the one mapping every surface uses: a cut answer is
        ``length`` (a cut call may lack arguments), an answer with calls ``tool_calls``, anything
        else ``stop`` (an end-of-turn token, a stop string, a cancelled or failed request)."""
        if self.reason == "length":
            return "length"
        return "tool_calls" if any(c.error is None for c in self.tool_calls) else "stop"


OpenAIFinishReason = Literal["stop", "length", "tool_calls"]


class Usage(BaseModel):
    """Token counts in the drafter's vocabulary (the members tokenize differently), OpenAI's names."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def from_stats(cls, stats: Stats) -> Usage:
        return cls(prompt_tokens=stats.prompt_tokens, completion_tokens=stats.tokens,
                   total_tokens=stats.prompt_tokens + stats.tokens)

    @classmethod
    def of_attempts(cls, attempts: Sequence[Stats]) -> Usage:
        """The sum over a request's attempts (a structured-output answer asked again reads its prompt again)."""
        each = [cls.from_stats(s) for s in attempts]
        return cls(prompt_tokens=sum(u.prompt_tokens for u in each),
                   completion_tokens=sum(u.completion_tokens for u in each),
                   total_tokens=sum(u.total_tokens for u in each))


Event = Annotated[TokenEvent | DraftEvent | VerifyEvent | EnsembleEvent | AdaFuseEvent | CacheSyncEvent
                  | ToolCallEvent | FormatRetryEvent | FinishEvent,
                  Field(discriminator="type")]
