"""User-facing configuration (pydantic): engine options and per-request generation parameters."""

from __future__ import annotations

import difflib
import math
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import InvalidParametersError, InvalidRequestError

DEFAULT_MAX_ACTIVE = 4
"""Requests that generate at once by default: what the HTTP server admits (``serve --max-active``)
and how many slots an in-process llama.cpp server gets (one per active request, each with its own
prefix cache). One number, so the server never admits more requests than the members have slots."""

Method = Literal["safe", "every-token", "gac-threshold", "single", "adafuse"]
METHODS: tuple[str, ...] = get_args(Method)

METHOD_DEFAULTS: dict[str, dict[str, object]] = {
    "safe": {"fusion": "unite", "sharpen": "heur", "drafter_confidence": 0.5, "drafter_weight": None,
             "drafter": "auto"},
    "every-token": {"fusion": "unite", "sharpen": None},
    "gac-threshold": {"fusion": "gac", "sharpen": None},
    "single": {"fusion": "unite", "sharpen": None},
    "adafuse": {"fusion": "unite", "sharpen": None},
}
"""Fusion and sharpening each method runs with unless told otherwise: every baseline as its own
paper defines it (every-token = UniTE at every step, gac-threshold = GaC's union vocabulary behind
its gate), and sharpening only for SAFE, whose paper introduced it. SAFE also keeps the drafter's
token where the drafter gives it >= 0.5 (the released code's GaC-variant gate): measured on GSM8K
(README Results) the paper's consensus rule alone lost significantly to the drafter alone, the gate
did not, and the gate skips the verifiers' forward on most rounds; ``drafter_confidence=None`` is
the paper's rule alone. And SAFE weighs the drafter twice each verifier (``drafter_weight=2``): with
equal weights a weak verifier's confident first word outvoted an unsure drafter (SQuAD, Qwen + Gemma:
0 questions won, 7 lost, one-sided p = 0.008), at 2:1 it did not (0 won, 2 lost), and on FLORES en-de 2:1 moved
the ensemble from 2.1 chrF below Qwen alone to level with it (README Results). ``drafter_weight=1``
gives the papers' equal weights. With more verifiers the default keeps the drafter's share at 2/3
(``drafter_weight=None``: twice the verifiers together, 4 for two verifiers): three members at 2, 1, 1
lost 5 SQuAD questions to Qwen alone and won 0 (p = 0.031), at 4, 1, 1 they lost 3 (p = 0.125).
With that weight the drafter must be the task's best member, so SAFE
picks it per request (``drafter="auto"``: the member that best predicts the prompt's example answers;
the first member where the prompt shows none): on TriviaQA, where Gemma-3-270m beats Qwen (12% vs 3%),
Qwen drafting scored 7% (1 won, 6 lost against Gemma, p = 0.06), the automatic choice 11% (2 / 3)."""


METHOD_OPTIONS: dict[str, frozenset[str]] = {
    "draft_length": frozenset({"safe", "single"}),
    "draft_schedule": frozenset({"safe"}),
    "max_draft_length": frozenset({"safe"}),
    "overlap": frozenset({"safe"}),
    "drafter_confidence": frozenset({"safe"}),
    "gate_threshold": frozenset({"gac-threshold"}),
    "fusion": frozenset({"safe", "every-token", "gac-threshold"}),
    "sharpen": frozenset({"safe", "every-token", "gac-threshold"}),
    "plausibility": frozenset({"safe", "every-token", "gac-threshold"}),
    "top_k": frozenset({"safe", "every-token", "gac-threshold"}),
    **{name: frozenset({"adafuse"}) for name in
       ("uncertainty", "threshold", "max_words", "num_candidates", "candidate_temperature", "vote")},
}
"""The methods that read each method-specific option; an option not named here (the generation
parameters, drafter, weights, profile, on_member_failure, ...) is read by every method. From the
engine's ``_round_function`` and ``policies.make_policy``: AdaFuse builds its settings from its own
six options and fuses nothing (no fuser, sharpening or plausibility cut); every-token and
gac-threshold draft one token a round (no schedule, no overlap) and never skip fusion on the
drafter's confidence; only gac-threshold has the gate; single drafts ``draft_length`` tokens a
round, fixed, and fuses nothing. ``EngineOptions`` warns where one is set for another method."""


class GenerationParams(BaseModel):
    """Per-request parameters; any of them can be given to ``astream``/``agenerate``."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(256, ge=1, description="Answer length cap, in drafter tokens.")
    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False, description="0 = greedy (the default, as in SAFE).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False, description="Nucleus sampling mass.")
    seed: int | None = Field(None, ge=-(2**63), lt=2**64,  # what torch.Generator.manual_seed accepts
                             description="Seed for sampling; fixed seed = reproducible answer.")
    stop: list[str] = Field(default_factory=list, description="Strings that end the answer.")
    loop_guard: int | None = Field(
        None, ge=8, le=4096,
        description="An exact repetition at the answer's end (two or more copies of a unit of up to 256 "
                    "bytes) may reach this many bytes; no token that repeats it further is drafted or "
                    "chosen by fusion (repetition.py). None: off.")

    @field_validator("stop", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else (value or [])

    @field_validator("stop")
    @classmethod
    def _non_empty(cls, value: list[str]) -> list[str]:
        if any(not s for s in value):
            raise ValueError("stop strings must be non-empty")
        return value


class EngineOptions(GenerationParams):
    """How the ensemble decodes. Generation parameters given here are the request defaults."""

    method: Method = Field("safe", description="safe | every-token | gac-threshold | single | adafuse")
    drafter: str | int | None = Field(
        None, description="Member name or index that drafts, or 'auto': per request, the member that best "
                          "predicts the prompt's example answers (its earlier assistant turns; with none, the "
                          "first member; see auto_weights.py). None: the method's default ('auto' for safe, "
                          "else the first member).")
    fit_cache: str | None = Field(
        None, description="drafter='auto': an SQLite file where the members' fits of a prompt's example answers "
                          "are kept across processes (created by the first fit), so a few-shot block scored once "
                          "is not scored again by the next process; None: kept in this engine's memory only. "
                          "The same fits, so the same drafter; on llama.cpp the logits after it may differ in "
                          "the last digits, and so now and then an answer, as between any cold and warm slot "
                          "(the scoring reads a prompt token by token, a batch prefill reads it at once: "
                          "docs/methods.md).")
    draft_length: int = Field(5, ge=1, le=64, description="Tokens drafted per round (SAFE's gamma); with "
                                                           "draft_schedule='adaptive', the first round's.")
    draft_schedule: Literal["fixed", "adaptive"] = Field(
        "adaptive", description="safe: 'fixed' drafts draft_length tokens every round; 'adaptive' grows the draft "
                             "by 2 after a round committed whole and shrinks it by 1 after a fusion changed a "
                             "token, within [1, max_draft_length], and ends a draft after a token the drafter "
                             "gives less than drafter_confidence (0.4 without one): dynamic speculation "
                             "lookahead, as Hugging Face's heuristic schedule with DISCO's confidence stop.")
    max_draft_length: int = Field(16, ge=1, le=64, description="draft_schedule='adaptive': the longest draft.")
    overlap: Literal["auto", "on", "off"] = Field(
        "auto", description="safe: while the verifiers score a draft, the drafter drafts the next round as if "
                            "the draft stands; kept where it does, stopped and thrown away where fusion changes "
                            "a token. The same greedy answers; with a seed, one answer per seed (not the same "
                            "as without overlap). 'auto': on where a member computes apart (a server "
                            "reached at a URL: vLLM, SGLang, llama.cpp), off where every member runs in this "
                            "process and shares its cores: measured level or slower there (docs/speed.md). "
                            "True / False read as 'on' / 'off'.")

    @field_validator("overlap", mode="before")
    @classmethod
    def _overlap_switch(cls, value: object) -> object:
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    fusion: Literal["unite", "gac"] = Field(
        "unite", description="Cross-vocabulary fusion (default per method: gac for gac-threshold, "
                             "else unite).")
    sharpen: Literal["heur", "heur-bytes", "geom"] | None = Field(
        "heur", description="Sharpening when fused max < 0.5 (default per method: heur for safe, "
                            "else None). heur pools a longer candidate onto a shorter one it starts with, "
                            "except where the shorter one ends inside a word the drafter writes "
                            "otherwise (' and' is not pooled onto ' a'), and a verifier's first piece of a "
                            "word the drafter has as one token counts for that word (' Kil' for ' Kilim'); "
                            "heur-bytes pools every byte extension, as the released SAFE code (except onto a "
                            "whitespace-only shorter candidate, which neither mode pools onto; the released code "
                            "skips only ' ').")
    weights: list[float] | Literal["auto"] | None = Field(
        None, description="Member weights in member order (default: drafter_weight for the drafter, 1 for the "
                          "others), or 'auto': per request, "
                          "from each member's fit of the prompt (PackLLM-sim, see auto_weights.py). A member "
                          "weighted 0 has no say: it adds no fusion candidates, never leads an AdaFuse round and "
                          "drafter='auto' never picks it; named as the drafter it only proposes (no "
                          "drafter_confidence or gate_threshold gate: the others decide every token).")

    @field_validator("weights")
    @classmethod
    def _usable_weights(cls, value: object) -> object:
        """Refused here, so a bad list fails before any member loads (not at the first request)."""
        if isinstance(value, list) and (not all(math.isfinite(w) and w >= 0 for w in value) or sum(value) <= 0):
            raise ValueError(f"weights must be finite, non-negative and not all zero, got {value}")
        return value

    drafter_weight: float | None = Field(
        1.0, gt=0.0, allow_inf_nan=False,
        description="With no weights given (no list, no 'auto', no profile): the drafter's weight relative to "
                    "each other member's 1, so the member that writes the text keeps more say where it is "
                    "unsure; 1 = equal weights; None = twice the other members together (2 with one verifier, "
                    "4 with two: the drafter holds 2/3). Default per method: None for safe, else 1.")
    weights_temperature: float = Field(
        1.0, gt=0.0, allow_inf_nan=False,
        description="weights='auto': softmax temperature over the members' prompt losses (PackLLM's 1).")
    profile: str | None = Field(
        None, description="A calibration profile (JSON from `safe-ensemble calibrate`): its weights, "
                          "drafter and drafter_confidence fill the options not given here.")
    gate_threshold: float = Field(
        0.5, gt=0.0, le=1.0,
        description="gac-threshold: fuse when the drafter gives the token it drafted less than this.")
    drafter_confidence: float | None = Field(
        None, gt=0.0, le=1.0,
        description="safe: skip fusion where the drafter's probability of its token is >= this "
                    "(default for safe: 0.5, as SAFE's GaC variant); None = the paper's consensus rule alone.")
    plausibility: float | None = Field(
        None, gt=0.0, le=1.0, allow_inf_nan=False,
        description="safe, every-token, gac-threshold: fusion commits only a candidate the drafter gives at least "
                    "this fraction of its own most likely candidate's probability (Contrastive Decoding's "
                    "adaptive plausibility constraint, alpha; e.g. 0.1): the verifiers rerank what the drafter "
                    "finds plausible, and cannot write a token it does not. None: off (UniTE's union).")
    top_k: int = Field(10, ge=1, le=100, description="UniTE's top-k per member.")
    on_member_failure: Literal["fail", "degrade"] = Field(
        "fail", description="A member's server fails mid-answer (MemberError): 'fail' ends the request "
                            "with the error; 'degrade' drops that member and goes on with the others "
                            "(the finish event's failed_members says so).")
    uncertainty: Literal["margin", "entropy"] = Field(
        "margin", description="adafuse: top-1 margin p1-p2 (the paper's) or entropy in nats.")
    threshold: float | None = Field(
        None, ge=0.0, description="adafuse: sure when margin >= this (default 0.7) or entropy <= this "
                                  "(default 0.6 nats).")
    max_words: int = Field(3, ge=1, le=16, description="adafuse: most words committed per confident span.")
    num_candidates: int = Field(3, ge=1, le=16,
                                description="adafuse: continuations each member proposes where unsure.")
    candidate_temperature: float = Field(
        0.0, ge=0.0, allow_inf_nan=False,
        description="adafuse: sample candidates past their first token at this temperature "
                    "(0: complete each first-token branch greedily).")
    vote: Literal["always", "uncertain"] = Field(
        "always", description="adafuse: 'always' (the released code): every member proposes a span every "
                              "round and the lowest weighted mean NLL wins; 'uncertain': a member that is "
                              "sure writes alone, the vote runs only where even the surest is unsure.")

    def drafter_weight_for(self, members: int) -> float:
        """The drafter's weight relative to each other member's 1 in an ensemble of ``members``."""
        return self.drafter_weight if self.drafter_weight is not None else 2.0 * max(members - 1, 1)

    @model_validator(mode="after")
    def _method_defaults(self) -> EngineOptions:
        for name, value in METHOD_DEFAULTS[self.method].items():
            if name not in self.model_fields_set or (name == "drafter" and self.drafter is None):
                object.__setattr__(self, name, value)  # stays "not set": a dump shows the value used
        return self

    @model_validator(mode="after")
    def _fits_kept_only_for_a_choice(self) -> EngineOptions:
        """fit_cache serves drafter='auto' alone: with the drafter named there is nothing to keep, and no
        file is made (an eval of every-token or of a named drafter leaves none in its folder)."""
        if self.drafter != "auto" and self.fit_cache is not None:
            object.__setattr__(self, "fit_cache", None)
        return self

    @model_validator(mode="after")
    def _first_draft_within_bounds(self) -> EngineOptions:
        if self.draft_schedule == "adaptive" and self.draft_length > self.max_draft_length:
            raise ValueError(f"draft_length ({self.draft_length}) exceeds max_draft_length "
                             f"({self.max_draft_length}) of the adaptive draft schedule (the default): raise "
                             f"max_draft_length, or draft a fixed length with draft_schedule='fixed'")
        return self

    @model_validator(mode="after")
    def _margin_at_most_one(self) -> EngineOptions:
        if self.uncertainty == "margin" and self.threshold is not None and self.threshold > 1.0:
            raise ValueError(f"a margin threshold must be in [0, 1], got {self.threshold}")
        return self

    @model_validator(mode="after")
    def _warn_ignored_by_method(self) -> EngineOptions:
        """Warn (not refuse: scripts pass one option set to every method) where an option set here is
        one this method never reads (``METHOD_OPTIONS``): adafuse with ``fusion="gac"`` or
        every-token with ``drafter_confidence`` ran exactly as without it, silently. Only options given
        with a value other than the method's default count, so a caller that passes every default
        explicitly (the CLI's ``--max-words 3`` under safe) is not told; and not ``drafter_confidence``
        next to a profile, which fills it whatever the method."""
        ignored = [name for name in ignored_options(self.method, self.model_fields_set, vars(self))
                   if not (name == "drafter_confidence" and self.profile is not None)]
        if ignored:
            given = "; ".join(f"{name}={getattr(self, name)!r} (read by {', '.join(sorted(METHOD_OPTIONS[name]))})"
                              for name in ignored)
            them = "it" if len(ignored) == 1 else "them"
            warnings.warn(f"method {self.method!r} does not read {given}: ignored, the answer is as without "
                          f"{them} (drop {them}, or choose a method that reads {them})", UserWarning,
                          stacklevel=_outside_stacklevel())
        return self


def _outside_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside this package and pydantic, for a warning raised in a
    validator: it then names the caller's line (``EnsembleEngine(..., fusion="gac")``), not pydantic's."""
    own = (__name__.rpartition(".")[0] + ".", "pydantic")
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(own):
        frame, level = frame.f_back, level + 1
    return level


def ignored_options(method: str, given: Iterable[str], values: Mapping[str, object]) -> list[str]:
    """The options in ``given`` (the names a caller set) that ``method`` does not read
    (``METHOD_OPTIONS``) and whose value in ``values`` differs from that method's default
    (``METHOD_DEFAULTS``, else the field's): a default passed explicitly changes nothing either way."""
    fields = EngineOptions.model_fields
    return [name for name in fields if name in given and name in METHOD_OPTIONS
            and method not in METHOD_OPTIONS[name]
            and values[name] != METHOD_DEFAULTS[method].get(name, fields[name].default)]


ModelT = TypeVar("ModelT", bound=BaseModel)


def unset_field(model: BaseModel, name: str) -> None:
    """``model.<name>`` back to its default, as set by no one (out of ``model_fields_set``): the adapters'
    ``max_tokens = None`` means "not set", and a length set by no one is never sent to the engine."""
    model.__dict__[name] = type(model).model_fields[name].default
    model.__pydantic_fields_set__.discard(name)


def copy_unsetting(copy: Callable[..., ModelT], update: Mapping[str, Any] | None, deep: bool,
                   name: str = "max_tokens") -> ModelT:
    """``copy(update=..., deep=...)`` (a pydantic ``model_copy``) where ``update={name: None}`` unsets the
    copy's field, as the adapters' constructors read None (``model_copy`` validates nothing: the engine
    was sent None)."""
    update = dict(update or {})
    unset = name in update and update[name] is None
    if unset:
        del update[name]
    if deep and update:
        # pydantic's deep copy with an update deep-copies the private attributes itself, not through
        # the model's ``__deepcopy__`` (which shares the engine): EnsembleLLM's engine holds locks, and
        # model_copy(update={"temperature": 0.7}, deep=True) raised "cannot pickle '_thread.lock' object"
        clone = copy(update=None, deep=True)
        _apply_update(clone, update)
    else:
        clone = copy(update=update, deep=deep)
    if unset:
        unset_field(clone, name)
    return clone


def _apply_update(model: BaseModel, update: Mapping[str, Any]) -> None:
    """``update`` set on ``model`` as pydantic's ``model_copy`` sets it: unvalidated, marked as set,
    keys that are no field going to the extras where the model allows extras."""
    allow_extra = type(model).model_config.get("extra") == "allow"
    for key, value in update.items():
        if allow_extra and key not in type(model).model_fields:
            if model.__pydantic_extra__ is None:
                model.__pydantic_extra__ = {}
            model.__pydantic_extra__[key] = value
        else:
            model.__dict__[key] = value
    model.__pydantic_fields_set__.update(update)


_OTHER_NAMES = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens",
                "stop_sequences": "stop", "random_seed": "seed"}
"""What other APIs (OpenAI, Anthropic, Mistral) call an engine parameter: users of the engine itself bring
those names, and the adapters' names are not accepted here."""


def _nested_model(model: type[BaseModel], path: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model a validation error's ``loc`` prefix points into (``http`` of a MemberConfig: its
    HttpSettings), or None where it is no model (a list, a dict, a union of several)."""
    for key in path:
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is None:
            return None
        models = [t for t in (field.annotation, *get_args(field.annotation))
                  if isinstance(t, type) and issubclass(t, BaseModel)]
        if len(models) != 1:
            return None
        model = models[0]
    return model


class MemberNames:
    """What ``members.config`` tells this module of the member options (``register_member_names``): the names
    the engine also takes engine-wide (MemberDefaults), other libraries' names for them, and the per-member
    hint. Registered, not imported: the members' config imports this module (an import back was a cycle)."""

    engine_wide: tuple[str, ...] = ()
    other_names: Mapping[str, str] = {}
    hint: Callable[[str, Sequence[str]], str] | None = None


def register_member_names(engine_wide: Sequence[str], other_names: Mapping[str, str],
                          hint: Callable[[str, Sequence[str]], str]) -> None:
    MemberNames.engine_wide, MemberNames.other_names, MemberNames.hint = tuple(engine_wide), other_names, hint


def _unknown_name_hint(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """`` (did you mean 'max_new_tokens'?)`` for a parameter the model does not have, or nothing."""
    owner, name = _nested_model(model, loc[:-1]), loc[-1]
    if owner is None or not isinstance(name, str):
        return ""
    accepted = list(owner.model_fields)
    if owner is EngineOptions:  # the engine takes the MemberDefaults engine-wide too (dtype=, slots=, device=)
        accepted += MemberNames.engine_wide
    return name_hint(name, accepted, per_request=owner is GenerationParams,
                     members=len(loc) == 1)  # inside a field's own model (a member's http), its names only


def name_hint(name: str, accepted: Sequence[str], per_request: bool = False, members: bool = True) -> str:
    """The hint for an unknown ``name`` among ``accepted``: the name meant (another API's name for
    it, or a close spelling), or where an engine option given per request goes, or (``members``) where
    a member option goes (``member_option_hint``); or nothing."""
    if per_request:  # an engine-wide option (or a close spelling of one) given per request
        engine_wide = [*EngineOptions.model_fields, *MemberNames.engine_wide]
        meant = MemberNames.other_names.get(name, name)
        if meant not in engine_wide and not difflib.get_close_matches(name, list(accepted), n=1, cutoff=0.75):
            # no per-request name is meant: perhaps a close spelling of an engine-wide one
            meant = next(iter(difflib.get_close_matches(name, engine_wide, n=1, cutoff=0.75)), name)
        if meant in engine_wide and meant not in accepted:
            guess = f"did you mean {meant!r}? " if meant != name else ""
            return f" ({guess}{meant} is an engine option: EnsembleEngine(..., {meant}=...))"
    known = _OTHER_NAMES.get(name)
    if known is None or known not in accepted:
        known = next(iter(difflib.get_close_matches(name, list(accepted), n=1, cutoff=0.75)), None)
    if known or not members or MemberNames.hint is None:
        return f" (did you mean {known!r}?)" if known else ""
    return MemberNames.hint(name, accepted)  # n_ctxx, n_gpu_layers, an n_ctx given engine-wide


def check_request_keywords(params: Iterable[str], keywords: Sequence[str], caller: str) -> None:
    """Refuse the names in ``params`` that are neither a generation parameter nor one of the
    ``caller``'s own ``keywords`` (``astream``'s tools, response_format, ...), as ``validated``
    refuses them, with the hint matched against every keyword the caller takes: a misspelt
    ``response_fromat`` or ``keep_event`` reached GenerationParams alone and got no hint there."""
    accepted = [*GenerationParams.model_fields, *keywords]
    unknown = [name for name in params if name not in accepted]
    if not unknown:
        return
    problems = "; ".join(f"{name}: Extra inputs are not permitted{name_hint(name, accepted, per_request=True)}"
                         for name in unknown)
    raise InvalidRequestError(f"invalid parameters: {problems}; accepted keywords of {caller}: {', '.join(accepted)}")


def validated(model: type[ModelT], /, **values: object) -> ModelT:
    """Build a pydantic model, turning validation errors into the engine's typed error."""
    try:
        return model(**values)
    except ValidationError as err:
        errors = err.errors()
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg'].removeprefix('Value error, ')}"
            + (_unknown_name_hint(model, e["loc"]) if e["type"] == "extra_forbidden" and e["loc"] else "")
            for e in errors)
        first = errors[0]
        raise InvalidParametersError(f"invalid parameters: {problems}", loc=".".join(map(str, first["loc"])) or None,
                                     kind=first["type"]) from None
