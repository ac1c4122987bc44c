"""Typed events streamed by the engine (pydantic, JSON-serialisable, stable ``type`` names).

A stream is: ``draft``/``verify``/``ensemble``/``adafuse``/``cache_sync`` events as decisions happen, a
``token`` event for every piece of committed text, and exactly one ``finish`` event at the end.
Concatenating the ``text`` of all ``token`` events gives the answer.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True)


class TokenEvent(_Event):
    type: Literal["token"] = "token"
    text: str = Field(description="Text delta (complete UTF-8 characters only).")
    source: Literal["draft", "ensemble"] = Field(
        description="'draft': a drafted token accepted as is; 'ensemble': chosen by fusion.")
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
                                    description="Each member's probability of its own next token.")


class VerifyEvent(_Event):
    type: Literal["verify"] = "verify"
    positions: list[VerifiedPosition]


class Candidate(BaseModel):
    text: str
    member_probs: dict[str, float]
    fused: float


class EnsembleEvent(_Event):
    type: Literal["ensemble"] = "ensemble"
    position: int = Field(description="Index in the answer (drafter tokens) of the fused token.")
    offset: int = Field(description="Byte offset in the answer where the fused token starts.")
    candidates: list[Candidate]
    sharpened: bool
    chosen: str
    drafted: str | None = Field(None, description="What the drafter had proposed here, if anything.")
    changed: bool = Field(description="The fused choice differs from the drafted token.")


class SpanCandidate(BaseModel):
    text: str = Field(description="The candidate span ('<eos>' for ending the answer).")
    proposed_by: list[str] = Field(description="Members whose continuations gave this span.")
    member_nll: dict[str, float] = Field(description="Mean token NLL of the span under each member.")
    score: float = Field(description="Weighted mean of member_nll; the lowest wins.")


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


class CacheSyncEvent(_Event):
    type: Literal["cache_sync"] = "cache_sync"
    member: str
    kept: int
    dropped: int


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
    spans: int = Field(0, description="AdaFuse: spans committed.")
    fused_spans: int = Field(0, description="AdaFuse: spans chosen by the members' vote.")
    forward_passes: dict[str, int] = Field(default_factory=dict)
    time_to_first_token_s: float | None = None
    elapsed_s: float = 0.0
    tokens_per_s: float = 0.0
    member_weights: dict[str, float] = Field(
        default_factory=dict, description="The fusion weight each member had in this request (weights='auto' "
                                          "resolved), summing to 1.")
    prompt_nll_per_byte: dict[str, float] = Field(
        default_factory=dict, description="weights='auto': each member's NLL of the prompt's content, "
                                          "nats per byte (lower = fits better).")


class FinishEvent(_Event):
    type: Literal["finish"] = "finish"
    reason: Literal["stop", "length", "eos", "cancelled", "error"]
    text: str = Field(description="The full answer.")
    stats: Stats
    failed_members: dict[str, str] = Field(
        default_factory=dict, description="Members dropped mid-answer (on_member_failure='degrade'): "
                                          "member -> the error.")


Event = Annotated[TokenEvent | DraftEvent | VerifyEvent | EnsembleEvent | AdaFuseEvent | CacheSyncEvent
                  | FinishEvent,
                  Field(discriminator="type")]
