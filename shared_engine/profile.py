"""Calibration profiles: member weights, drafter and ``drafter_confidence`` fitted on labelled
development data (``safe-ensemble calibrate``, calibration.py), saved as JSON and accepted by
every surface as ``profile=`` / ``--profile``.

A profile's values are defaults: an option given explicitly (not None) wins. A profile names its
members; an engine whose members are not the same models (in any order) refuses it.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from .errors import InvalidRequestError
from .members import MemberConfig, parse_member_spec

if TYPE_CHECKING:
    from .members import Member

log = logging.getLogger(__name__)


_Share = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
"""A fraction of choices (a threshold's accuracy)."""
_Nats = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
"""A negative log-likelihood: never below 0."""


class FitInfo(BaseModel):
    """How a profile was fitted, so a reader can judge it. The numbers are bounded as a fit writes them: a
    hand-edited ``questions: -5`` (or 0, a negative count, an accuracy of 1.5) loaded as a fit of no
    questions; it is refused naming the field."""

    bench: str
    data: str = Field(description="The labelled file fitted on (a train/dev split, never a test split).")
    questions: int = Field(ge=1, description="Questions used.")
    asked: int | None = Field(None, ge=1, description="Questions the fit set out to read (--limit, or as many as "
                                                      "the split has); absent in profiles written before it.")
    interrupted: bool = Field(False, description="Cut short (Ctrl-C): fitted on the ``questions`` read of the "
                                                 "``asked``, a partial fit.")
    spans: int = Field(0, ge=0, description="Spans between shared token boundaries the weights were fitted on.")
    positions: int = Field(0, ge=0, description="Fusable drafter positions drafter_confidence was chosen on.")
    method: str = Field(description="How weights, drafter and drafter_confidence were chosen.")
    nll_per_byte: dict[str, _Nats] = Field(default_factory=dict,
                                           description="Each member's NLL of the reference answers, nats/byte.")
    log_likelihood: float | None = Field(None, allow_inf_nan=False,
                                         description="Of the spans under the fitted mixture, nats.")
    threshold_accuracy: dict[str, _Share] = Field(
        default_factory=dict, description="Right choices at fusable positions for each drafter_confidence "
                                          "tried ('none' = always fuse).")

    @model_validator(mode="after")
    def _read_of_asked(self) -> FitInfo:
        """A fit reads at most the questions it set out to read (fewer where it was cut short or a question
        did not fit a member's window)."""
        if self.asked is not None and self.questions > self.asked:
            raise ValueError(f"questions ({self.questions}) is more than asked ({self.asked}): a fit reads at most "
                             "the questions it set out to read")
        return self


PROFILE_VERSION = 1
"""The profile format this safe-ensemble writes and reads; a newer one is refused, not half read."""
_VERSION = TypeAdapter(int)
"""How the ``version`` field reads its value (lax: ``"2"`` and ``2.0`` are 2), for the check before it."""


class EnsembleProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = PROFILE_VERSION
    members: list[str] = Field(min_length=1, description="Member names (zoo names, model folders, GGUF stems).")
    weights: list[float] = Field(description="Fusion weight of each member, in ``members`` order; sums to 1.")
    drafter: str = Field(description="The member that drafts.")
    drafter_confidence: float | None = Field(None, gt=0.0, le=1.0)
    fitted: FitInfo
    sources: list[str | None] | None = Field(
        None, description="Where each member was read from, for members that are local folders or files "
                          "(None: a zoo name, hub id or server): a member of the same name read from "
                          "elsewhere is warned about. Absent in profiles written before it.")

    @model_validator(mode="before")
    @classmethod
    def _known_version(cls, data: Any) -> Any:
        """Before the fields: a newer profile's new fields would otherwise be all the error said. The
        version is compared as the field will hold it: ``"2"`` or ``2.0`` (a hand edit, another writer)
        is version 2, refused as newer, not passed over here and then read as 2 by the field; a version
        below 1 (none was ever written) is refused, not read as this one; ``true``/``false`` is no whole
        number (lax int had read ``true`` as version 1)."""
        if not isinstance(data, dict) or data.get("version") is None:
            return data  # absent: this version; null: the field refuses it
        not_whole = ValueError(f"profile version must be a whole number (this safe-ensemble reads "
                               f"{PROFILE_VERSION}), got {data['version']!r}")
        if isinstance(data["version"], bool):  # lax int reads true as 1 (loaded as this version), false as 0
            raise not_whole
        try:
            version = _VERSION.validate_python(data["version"])
        except ValidationError:
            raise not_whole from None
        if version < 1:  # versions start at 1: 0 or -1 is no profile this or any safe-ensemble wrote
            raise ValueError(f"profile version must be 1 or more (this safe-ensemble reads {PROFILE_VERSION}), "
                             f"got {data['version']!r}")
        if version > PROFILE_VERSION:
            raise ValueError(f"profile version {version} is newer than this safe-ensemble reads "
                             f"({PROFILE_VERSION}): upgrade safe-ensemble, or calibrate again with this one")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> EnsembleProfile:
        if len(self.weights) != len(self.members):
            raise ValueError(f"{len(self.weights)} weights for {len(self.members)} members")
        if not all(math.isfinite(w) and w >= 0 for w in self.weights) or sum(self.weights) <= 0:
            raise ValueError("weights must be finite, non-negative and not all zero")
        if self.drafter not in self.members:
            raise ValueError(f"drafter {self.drafter!r} is not one of the members {self.members}")
        return self

    def save(self, path: str | Path) -> None:
        """Written whole or not at all: an interrupted save leaves any earlier profile there intact."""
        target = Path(path).expanduser()
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            temporary.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: str | Path) -> EnsembleProfile:
        try:
            text = Path(path).expanduser().read_text(encoding="utf-8-sig")  # a BOM (Windows editors) too
        except OSError as err:
            raise InvalidRequestError(f"cannot read profile {path}: {err.strerror or err}") from None
        except UnicodeDecodeError:
            raise InvalidRequestError(f"{path} is not a profile: not UTF-8 text (a JSON file from "
                                      "`safe-ensemble calibrate` is)") from None
        try:
            return cls.model_validate_json(text)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in err.errors())
            raise InvalidRequestError(f"{path} is not a valid profile: {problems}") from None


def profile_digest(path: str | Path) -> str:
    """What a profile file holds, as a short digest: a cache keyed on the path alone (an adapter's
    shared engine, LangChain's response cache) would keep a re-fitted profile's old values."""
    try:
        return hashlib.sha256(Path(path).expanduser().read_bytes()).hexdigest()[:16]
    except (OSError, TypeError, ValueError):  # not a path (a dict, a number), a NUL in it: not a file
        return "unreadable"  # the engine refuses it with the reason


def member_key(spec: str | MemberConfig | Member) -> str:
    """The model a member spec names, independent of backend: ``llamacpp:qwen2.5-coder-0.5b-instruct``
    and ``qwen2.5-coder-0.5b-instruct`` are the same model; a path or hub id counts by its last part
    (a .gguf without its suffix), also as the tokenizer of a server (``vllm:http://h:8000#org/name``
    is ``name``, as ``org/name`` in process is); a Member by its name."""
    if isinstance(spec, MemberConfig):
        spec = spec.model
    if not isinstance(spec, str):  # a loaded member: its name, read as a spec (a hub id's "org/name" too)
        try:
            return member_key(spec.name)
        except InvalidRequestError:
            return spec.name
    parsed = parse_member_spec(spec)
    target = (parsed.tokenizer or parsed.target) if parsed.is_url else parsed.target
    if parsed.is_url and not parsed.tokenizer:
        return target  # a server without a named tokenizer: its address is all there is
    name = Path(target.rstrip("/")).name if "/" in target else target
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def member_keys(specs: Sequence[str | MemberConfig | Member]) -> list[str]:
    """Each member's ``member_key``; where two different paths share a last part (``run1/final``,
    ``run2/final``), as many of their last parts as tell them apart. The same model twice keeps
    one key (a repeated name pairs in order)."""
    keys = [member_key(s) for s in specs]
    paths = [_local_path(s) for s in specs]
    for key in set(keys):
        same = [i for i, k in enumerate(keys) if k == key and paths[i] is not None]
        if len({paths[i] for i in same}) < 2:
            continue
        parts = {i: Path(str(paths[i])).parts for i in same}
        depth = 2
        while len({parts[i][-depth:] for i in same}) < len({paths[i] for i in same}) and \
                depth < max(len(p) for p in parts.values()):
            depth += 1
        for i in same:
            keys[i] = "/".join(parts[i][-depth:-1] + (key,))
    return keys


def local_sources(specs: Sequence[str | MemberConfig | Member]) -> list[str | None]:
    """Each member's resolved local folder or file (None where it is not one): a profile's ``sources``."""
    return [str(p) if (p := _local_path(s)) is not None else None for s in specs]


def _local_path(spec: str | MemberConfig | Member) -> Path | None:
    """The resolved folder or file a spec names on this machine (None: a zoo name, hub id, server)."""
    target = spec.model if isinstance(spec, MemberConfig) else spec
    if not isinstance(target, str):
        return None
    try:
        parsed = parse_member_spec(target)
    except InvalidRequestError:
        return None
    path = Path(parsed.target).expanduser()
    return path.resolve() if not parsed.is_url and path.exists() else None


def apply_profile(specs: Sequence[str | MemberConfig | Member], options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with the profile named by ``options["profile"]`` filling weights (unless weights or
    drafter_weight is given) and drafter where they are absent or None, and drafter_confidence where it
    is absent (an explicit None asks for the paper's rule). Raises if the members do not match; warns
    where the profile's fit was interrupted (``FitInfo.interrupted``: fitted on part of the questions)."""
    merged = dict(options)
    path = merged.get("profile")
    if path is None:
        return merged
    if not isinstance(path, (str, Path)):
        raise InvalidRequestError(f"profile must be a path to a profile JSON, got {type(path).__name__}")
    merged["profile"] = str(path)
    profile = EnsembleProfile.load(path)
    keys = member_keys(specs)
    if sorted(keys) != sorted(profile.members):
        raise InvalidRequestError(f"profile {path} was fitted for members {profile.members}, but this ensemble "
                                  f"has {keys}; {_mismatch_advice(specs, keys, profile.members)}")
    order = _match(keys, profile.members)
    if profile.fitted.interrupted:  # a partial fit (Ctrl-C during calibrate) says so where it is used
        of = "" if profile.fitted.asked is None else f" of {profile.fitted.asked}"
        log.warning("profile %s: its fit was interrupted after %d%s questions (a partial fit); calibrate again "
                    "for a full one", path, profile.fitted.questions, of)
    if profile.sources is not None and len(profile.sources) == len(profile.members):
        for spec, key, j in zip(specs, keys, order):
            here, fitted = _local_path(spec), profile.sources[j]
            if here is not None and fitted is not None and str(here) != fitted:
                log.warning("profile %s: member %r was fitted from %s, this ensemble reads it from %s",
                            path, key, fitted, here)
    if merged.get("weights") is None and merged.get("drafter_weight") is None:  # an explicit drafter_weight wins
        merged["weights"] = [profile.weights[j] for j in order]
    if merged.get("drafter") is None:
        merged["drafter"] = keys.index(profile.drafter)
    elif "drafter_confidence" not in merged and merged.get("method", "safe") == "safe" and \
            _drafter_index(specs, keys, merged["drafter"]) != keys.index(profile.drafter):  # safe alone reads it
        log.warning("profile %s: its drafter_confidence %s was fitted for drafter %s, not %s; pass "
                    "drafter_confidence (--drafter-confidence) to choose one for that drafter",
                    path, profile.drafter_confidence, profile.drafter, merged["drafter"])
    if "drafter_confidence" not in merged:
        merged["drafter_confidence"] = profile.drafter_confidence
    return merged


def _drafter_index(specs: Sequence[str | MemberConfig | Member], keys: Sequence[str], drafter: object) -> int | None:
    """The member a ``drafter`` option names (an index, a model or a member's name); None for ``auto``
    (chosen per request) or a name the engine will refuse."""
    if isinstance(drafter, int) or (isinstance(drafter, str) and drafter.isdigit()):
        return int(drafter)
    if drafter in keys:
        return keys.index(str(drafter))
    if isinstance(drafter, str) and drafter != "auto":
        try:
            key = member_key(drafter)  # a spec: llamacpp:NAME is NAME
        except InvalidRequestError:
            key = None
        if key in keys:
            return keys.index(str(key))
    names = [spec.name if isinstance(spec, MemberConfig) else getattr(spec, "name", spec) for spec in specs]
    return names.index(drafter) if drafter in names else None


def _mismatch_advice(specs: Sequence[str | MemberConfig | Member], keys: Sequence[str],
                     names: Sequence[str]) -> str:
    """What to do about members a profile does not name. A server member is the model its ``#``
    names (its address where none is): the same model behind vLLM takes the profile once the spec
    names it, where calibrating again would tie the profile to host:port."""
    unmatched = list(names)
    for key in keys:
        if key in unmatched:
            unmatched.remove(key)
    servers = []
    for spec, key in zip(specs, keys):
        target = spec.model if isinstance(spec, MemberConfig) else spec
        if key in names or not isinstance(target, str):
            continue
        try:
            parsed = parse_member_spec(target)
        except InvalidRequestError:
            continue
        if parsed.is_url:
            servers.append(str(parsed.model_copy(update={"tokenizer": None})))
    if not servers or not unmatched:
        return "calibrate again for these members"
    name = unmatched[0] if len(unmatched) == 1 else "<the profile's member name>"
    return (f"a server member is known by the model its spec names after '#' (by its address where none is "
            f"named): if it serves {' or '.join(unmatched)}, add '#<profile member name>', e.g. {servers[0]}#{name}")


def _match(keys: Sequence[str], names: Sequence[str]) -> list[int]:
    """For each engine member, the index of the profile member it is (a repeated name pairs in order)."""
    used: set[int] = set()
    order = []
    for key in keys:
        j = next(j for j, name in enumerate(names) if name == key and j not in used)
        used.add(j)
        order.append(j)
    return order
