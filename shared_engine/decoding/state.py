"""One request's canonical state: the committed answer and what every member holds of it.

The answer is kept as **bytes** (so a character split across tokens is never garbled) together
with the drafter's own ids that spell it. Verifiers hold their own tokenization of the same bytes
(``TokenizedText``, re-encoded incrementally). Every commit goes through ``commit`` so that token
counting, stop strings, max_new_tokens, UTF-8-safe text deltas and a JSON constraint are handled
in one place.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..alignment import TokenizedText, TokenTable
from ..events import CacheSyncEvent, Stats, TokenEvent
from ..json_constraint import JsonPrefix
from ..members import Member, Session
from ..repetition import MAX_PERIOD, loop_unit
from ..tools import CallEnd, CallEndFinder
from ..turn_markers import MARKER_COUNTED, read_turn_markers
from .drafts import AheadDraft


def spell_bytes(table: TokenTable, piece: bytes, member: str = "member") -> list[int]:
    """Ids of ``table`` spelling exactly ``piece``: one token if the vocabulary has it, else the
    canonical spelling of the text, else single-byte tokens (for bytes that are not valid UTF-8)."""
    token = table.token_id(piece)
    if token is not None:
        return [token]
    try:
        return table.spell(piece.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        pass
    singles = [table.token_id(bytes([b])) for b in piece]
    if any(t is None for t in singles):
        raise ValueError(f"{member} cannot spell {piece!r}")
    return [t for t in singles if t is not None]


@dataclass(slots=True)
class RequestMember:
    """One member's part in one request: everything the decoders read of it, in one record, so
    that dropping a member (its server failed) removes exactly one thing."""

    member: Member
    label: str  # unique display name (the same model may appear twice)
    session: Session  # this request's KV cache in the member
    prompt_ids: list[int]  # the prompt in the member's own chat format
    weight: float  # its fusion weight; the request's weights sum to 1
    turn_stops: tuple[str, ...] = ()
    """A plain-format member's turn marker (``Member.stop_strings``) where the answer is a chat turn;
    none for a raw prompt's continuation, which is no turn."""
    tokens: TokenizedText = field(init=False)  # its canonical tokenization of the answer (incremental)

    def __post_init__(self) -> None:
        self.tokens = TokenizedText(self.member.table)

    @property
    def table(self) -> TokenTable:
        return self.member.table

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.member.eos_ids

    def read(self, logits: torch.Tensor, text: bytes, end: int, writing: bool = False) -> tuple[torch.Tensor, bool]:
        """The member's next-token logits after the answer ``text[:end]`` as the decoders use them: a
        plain-format member's turn marker read as its end of turn (turn_markers.py; ``writing``: the
        member writes this token itself). Also whether the marker held enough mass to be counted."""
        out, mass = read_turn_markers(logits, self.table, self.turn_stops, text, writing, end)
        return out, mass >= MARKER_COUNTED


def request_members(members: Sequence[Member], labels: Sequence[str], sessions: Sequence[Session],
                    prompt_ids: Sequence[list[int]], weights: torch.Tensor | None = None,
                    chat_turn: bool = True) -> list[RequestMember]:
    """One record per member, in decoding order (drafter first); ``weights`` default to equal.
    ``chat_turn``: the answer is an assistant turn (False: a raw prompt's continuation)."""
    if weights is None:
        weights = torch.full((len(members),), 1 / len(members))
    return [RequestMember(m, label, session, ids, w, m.stop_strings if chat_turn else ())
            for m, label, session, ids, w in zip(members, labels, sessions, prompt_ids, weights.tolist())]


@dataclass
class RequestState:
    members: list[RequestMember]  # members[0] is the drafter
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    constraint: JsonPrefix | None = None  # response_format: the JSON parser state of the answer so far
    loop_guard: int | None = None  # bytes an exact repetition at the answer's end may reach (repetition.py)
    every_member_writes: bool = False
    """Whether any member may write the answer (AdaFuse's spans): then every plain-format member's turn
    stop ends it. Else the drafter writes it (a fused token is its spelling, and a plain verifier's
    turn marker is read as its EOS), so only the drafter's turn stops do: a chat drafter's line
    "User: hi" is its text, whoever verifies it."""
    answer: bytearray = field(default_factory=bytearray)
    drafter_ids: list[int] = field(default_factory=list)
    text: str = ""  # decoded answer (complete characters only)
    emitted: int = 0  # characters of ``text`` already sent as token events
    finish_reason: str | None = None
    stop_string: str | None = None  # the user's stop string that ended the answer (not a turn marker)
    cut_from: int | None = None
    """The first position whose text a stop string cut away entirely (the one after the last token
    keeping text): still counted in ``stats.tokens`` (as vLLM counts the token holding a stop), but no
    text is released at it or after, so no decision there is sent or counted."""
    failed_members: dict[str, str] = field(default_factory=dict)
    stats: Stats = field(default_factory=Stats)
    draft_length: int | None = None  # the next SAFE round's, as the policy's schedule set it (None: its start)
    ahead: AheadDraft | None = None  # the next round's draft, written during this round's verification (overlap)
    started: float = field(default_factory=time.perf_counter)
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))
    _call_ends: dict[str, CallEndFinder] = field(init=False, repr=False, default_factory=dict)
    _origins: list[tuple[int, int, str]] = field(init=False, repr=False, default_factory=list)
    """(offset in ``text``, position, source) where each committed token's characters start, from the
    one holding the first unsent character on: text held back as a possible stop's start is sent
    later under its own token's position and source, not the token that released it."""
    _sent_through: int = field(init=False, repr=False, default=-1)
    """The position of the last token whose characters were all sent (and its origin forgotten)."""

    def __post_init__(self) -> None:
        self.stats.prompt_tokens = len(self.members[0].prompt_ids)
        self.stats.member_weights = self.weight_stats()
        self.stats.drafter = self.members[0].label
        self.stats.constrained = self.constraint is not None
        self._call_ends = {stop: stop.finder() for stop in self.stop if isinstance(stop, CallEnd)}

    def loop_tail(self, text: bytes | None = None) -> bytes | None:
        """The last bytes of ``text`` (default: the answer) that the loop guard looks at; None when
        the guard is off."""
        if self.loop_guard is None:
            return None
        keep = 2 * MAX_PERIOD + self.loop_guard
        return bytes(self.answer[-keep:]) if text is None else text[-keep:]

    def loop_at(self, tail: bytes | None) -> bytes | None:
        """The unit that ``tail`` (from ``loop_tail``) ends repeating, if it is a loop the guard stops."""
        return None if tail is None or self.loop_guard is None else loop_unit(tail, self.loop_guard)

    @property
    def drafter(self) -> RequestMember:
        return self.members[0]

    @property
    def verifiers(self) -> list[RequestMember]:
        return self.members[1:]

    @property
    def weights(self) -> torch.Tensor:
        """The members' fusion weights in decoding order (float32, sums to 1)."""
        return torch.tensor([m.weight for m in self.members], dtype=torch.float32)

    def set_weights(self, weights: torch.Tensor) -> None:
        """This request's weights (``weights="auto"``), one per member in decoding order."""
        for record, weight in zip(self.members, weights.tolist()):
            record.weight = weight
        self.stats.member_weights = self.weight_stats()

    def weight_stats(self) -> dict[str, float]:
        return {m.label: round(m.weight, 5) for m in self.members}

    @property
    def answer_end(self) -> int:
        """Positions the answer holds for the client: its tokens, plus the EOS that ended it, up to the
        first token a stop string cut away entirely (a decision at or past it describes no text)."""
        if self.cut_from is not None:
            return self.cut_from
        return self.stats.tokens + (self.finish_reason == "eos")

    def drafter_target(self) -> list[int]:
        return self.drafter.prompt_ids + self.drafter_ids

    def ids_for_piece(self, piece: bytes) -> list[int]:
        """Drafter ids spelling ``piece`` (a candidate that may come from another vocabulary)."""
        return spell_bytes(self.drafter.table, piece, self.drafter.member.name)

    def member_context(self, index: int) -> list[int]:
        """Prompt + answer in member ``index``'s ids, as that member reads it (see ``reading``)."""
        if index == 0:
            return self.drafter_target()
        return self.members[index].prompt_ids + self.reading(index, bytes(self.answer), []).ids

    def reading(self, index: int, text: bytes, draft_ids: list[int]) -> TokenizedText:
        """How verifier ``index`` reads ``text`` (the answer, then ``draft_ids`` if ``text`` holds
        them): the canonical re-tokenization in its own vocabulary, or, for a verifier sharing the
        drafter's vocabulary, the drafter's own ids (plain speculative verification: no
        re-tokenization, so a non-canonical drafter split is read exactly as written)."""
        verifier = self.members[index]
        if not verifier.table.same_vocabulary(self.drafter.table):
            verifier.tokens.set_text(text)
            return verifier.tokens
        table = self.drafter.table
        ids = self.drafter_ids + (draft_ids if len(text) > len(self.answer) else [])
        ids = [t for t in ids if t not in table.eos_ids]
        ends, end = [], 0
        for token in ids:
            end += len(table.pieces[token])
            ends.append(end)
        return TokenizedText(table, ids, ends, table.to_bytes(ids))

    def weighted(self) -> list[int]:
        """The members with a say: a member weighted 0 neither drafts (the drafter_confidence gate would
        commit its sure tokens unfused) nor leads an AdaFuse span."""
        return [i for i, m in enumerate(self.members) if m.weight > 0]

    def make_drafter(self, index: int) -> None:
        """Before the first round: member ``index`` drafts (``drafter="auto"``); each member keeps its weight."""
        if self.answer or self.stats.rounds:
            raise RuntimeError("the drafter is chosen before the answer starts")
        self.members.insert(0, self.members.pop(index))
        self.stats.prompt_tokens = len(self.members[0].prompt_ids)
        self.stats.member_weights = self.weight_stats()
        self.stats.drafter = self.members[0].label

    def drop_member(self, index: int, reason: str) -> None:
        """Go on without member ``index`` (its server failed): its record goes, the others'
        weights are renormalised (and reported so in the stats). If the drafter goes, the next
        member drafts from its canonical tokenization of the answer, so nothing committed changes."""
        gone = self.members[index]
        self.failed_members[gone.label] = reason
        close = getattr(gone.session, "close", None)
        if close is not None:
            close()
        rest = torch.cat([self.weights[:index], self.weights[index + 1:]])
        del self.members[index]
        if index == 0:
            heir = self.drafter.tokens
            heir.set_text(bytes(self.answer))
            self.drafter_ids = list(heir.ids)
        self.set_weights(rest / rest.sum() if float(rest.sum()) > 0 else torch.full_like(rest, 1 / len(rest)))

    def canonical_texts(self) -> list[TokenizedText]:
        """Every member's canonical tokenization of the answer (for boundary checks)."""
        for record in self.members:
            record.tokens.set_text(bytes(self.answer))
        return [m.tokens for m in self.members]

    def commit(self, ids: list[int], source: str) -> list[TokenEvent]:
        """Append drafter ids to the answer; returns the token events to stream. Sets
        ``finish_reason`` on EOS, a stop string, max_new_tokens or a completed JSON answer (and
        commits nothing after). Under a JSON constraint only text that keeps the answer a valid
        prefix is committed (the round only offers such text; this is the guard)."""
        events: list[TokenEvent] = []
        for token in ids:
            if self.finish_reason:
                break
            if token in self.drafter.eos_ids:
                self.finish_reason = "eos"
                break
            position = self.stats.tokens
            piece = self.drafter.table.pieces[token]
            if self.constraint is not None:
                constraint = self.constraint.after(piece)
                if constraint is None:
                    self.finish_reason = "stop"
                    break
                self.constraint = constraint
            self.drafter_ids.append(token)
            self.answer += piece
            self.stats.tokens += 1
            if source == "draft":
                self.stats.accepted_tokens += 1
            else:
                self.stats.chosen_tokens += 1
            decoded = self._decoder.decode(piece)
            if decoded:  # a character split across tokens is the token's that completes it
                self._origins.append((len(self.text), position, source))
                self.text += decoded
            start = self.emitted
            self._release_text()
            released = self._token_events(start, self.emitted)
            if released and self.stats.time_to_first_token_s is None:
                self.stats.time_to_first_token_s = time.perf_counter() - self.started
            events += released
            if not self.finish_reason and self.constraint is not None and self.constraint.finished:
                self.finish_reason = "stop"
            if not self.finish_reason and self.stats.tokens >= self.max_new_tokens:
                self.finish_reason = "length"
        return events

    def _release_text(self) -> None:
        """Moves ``emitted`` past the text that can be sent now: stops at a stop string, holds back a
        possible stop prefix. A
        ``CallEnd`` is found where it ends a call (its finder reads the call's JSON), and the answer
        ends after it."""
        cuts = []  # every stop is searched in the same text: the earliest wins, whatever the list order
        writers = self.members if self.every_member_writes else self.members[:1]  # the drafter now (it may change)
        for stop in self.stop + tuple(s for record in writers for s in record.turn_stops):
            finder = self._call_ends.get(stop) if isinstance(stop, CallEnd) else None
            cut = finder.find(self.text) if finder else self.text.find(stop, max(0, self.emitted - len(stop)))
            if cut >= 0:
                cuts.append((cut, stop))
        if cuts:
            cut, stop = min(cuts, key=lambda found: found[0])
            self._mark_cut(cut)
            self.text = self.text[:cut]
            self.finish_reason = "stop"
            if stop in self.stop and not isinstance(stop, CallEnd):  # a stop string the request gave
                self.stop_string = str(stop)
        hold = 0
        if not self.finish_reason:  # every member's turn stop is held back: ``flush`` may drop its start
            for stop in self.stop + tuple(s for record in self.members for s in record.turn_stops):
                for n in range(min(len(stop) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(stop[:n]):
                        hold = max(hold, n)
                        break
        self.emitted = max(self.emitted, len(self.text) - hold)

    def _mark_cut(self, cut: int) -> None:
        """Record the first position after the last token keeping text before ``cut``: the stop string
        may start in an earlier token than the one that completed it (" " then "t" for " t"), and a
        token holding only the first bytes of a cut character loses them too."""
        if self.cut_from is None and any(offset >= cut for offset, _, _ in self._origins):
            kept = [position for offset, position, _ in self._origins if offset < cut]
            self.cut_from = (kept[-1] if kept else self._sent_through) + 1

    def flush(self) -> list[TokenEvent]:
        """At the end: release held-back text (a dangling partial character is dropped). After an EOS,
        text held back as the start of a member's turn marker (the "\\n" of "\\nUser:") is dropped with
        it: fusion ended there with that marker's mass (turn_markers.py), so the member's stop string
        is what ended the answer, and a stop string is trimmed whole."""
        # Incomplete trailing bytes stay inside the decoder and are dropped: never a U+FFFD.
        held = self.text[self.emitted:]
        if held and self.finish_reason == "eos" and any(
                stop.startswith(held) for record in self.members for stop in record.turn_stops):
            self.text = self.text[:self.emitted]
        start, self.emitted = self.emitted, len(self.text)
        return self._token_events(start, self.emitted)

    def _token_events(self, start: int, end: int) -> list[TokenEvent]:
        """The events sending ``text[start:end]``: one per token whose characters it holds, each with
        that token's position and source (held-back text may span several tokens, of earlier rounds
        and other sources). Forgets the tokens wholly sent."""
        events: list[TokenEvent] = []
        origins = self._origins
        last = 0  # the token holding text[end], the first character still unsent
        for i, (offset, position, source) in enumerate(origins):
            until = origins[i + 1][0] if i + 1 < len(origins) else end
            if offset <= end:
                last = i
            if max(offset, start) < min(until, end):
                events.append(TokenEvent(text=self.text[max(offset, start):min(until, end)],
                                         source=source, position=position))
        if last:
            self._sent_through = origins[last - 1][1]
        del origins[:last]
        return events

    def sync_events(self) -> list[CacheSyncEvent]:
        events = []
        for record in self.members:
            kept, dropped = record.session.last_sync
            if dropped:
                events.append(CacheSyncEvent(member=record.label, kept=kept, dropped=dropped))
                record.session.last_sync = (kept, 0)
        return events

    def finalize_stats(self) -> Stats:
        stats = self.stats
        stats.elapsed_s = time.perf_counter() - self.started
        stats.forward_passes = {m.label: m.session.num_forwards for m in self.members}
        # The position where the answer ended with EOS was decided too (and may have been fused).
        positions = stats.tokens + (1 if self.finish_reason == "eos" else 0)
        stats.ensemble_rate = stats.ensembled_tokens / positions if positions else 0.0
        stats.tokens_per_s = stats.tokens / stats.elapsed_s if stats.elapsed_s > 0 else 0.0
        return stats
