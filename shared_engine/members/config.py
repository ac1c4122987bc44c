"""``MemberConfig``: the one description of a member, used by the engine, both adapters and the
CLI (``--members FILE``, a YAML or JSON list of these).

    MemberConfig(model="Qwen/Qwen2.5-7B-Instruct", device="cuda:0", dtype="bfloat16")
    MemberConfig(model="llamacpp:smollm2-135m-instruct", threads=2, name="smol")
    MemberConfig(model="vllm:http://gpu-box:8000", top_k=20, http={"timeout_s": 30})

Options belong to a backend, and setting one on a member of another backend is an error (a
``dtype`` for a vLLM server would silently do nothing). ``MemberDefaults`` are the engine-wide
placement options (``EnsembleEngine(..., device_map="auto", dtype="bfloat16")``); they fill in what
a transformers member does not set itself and do not touch other backends.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import inspect
import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..errors import InvalidRequestError
from ..options import register_member_names, validated
from . import devices
from .devices import DType
from .http import HttpSettings
from .spec import Backend, MemberSpec, parse_member_spec, split_prefix

DeviceMap = str | dict[str, int | str]

PLACEMENT_FIELDS = ("device", "device_map", "dtype", "attn_implementation", "compile")
"""Options of in-process transformers members."""
SERVER_FIELDS = ("top_k", "http")
"""Options of members that talk to a llama.cpp, vLLM or SGLang server."""
LLAMACPP_FIELDS = ("threads", "slots", "n_ctx", "poll")
"""Options of a llama.cpp server this process starts for a GGUF."""
LLAMACPP_CLIENT_FIELDS = ("reuse_prompt_cache",)
"""Options of any llama.cpp member, in this process or at a URL."""
LLAMACPP_URL_FIELDS = ("pin_slots",)
"""Options of a llama.cpp member at a URL (a ``llama-server`` this process did not start)."""
OPTION_FIELDS = PLACEMENT_FIELDS + SERVER_FIELDS + LLAMACPP_FIELDS + LLAMACPP_CLIENT_FIELDS + LLAMACPP_URL_FIELDS
"""Every backend option (the loaders' keywords)."""

ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3",
                        "flash_attention_4")
"""transformers' own attention kernels (those its error lists). Also accepted, as transformers accepts
them: a ``paged|`` one, a hub kernel (``org/repo[@revision][:name]``), and a name registered with
``AttentionInterface.register`` (then transformers is imported: it is read from its registry)."""
_HUB_KERNEL = re.compile(r"[^/:]+/[^/:]+(?:@[^/:]+)?(?::[^/:]+)?")  # transformers' is_kernel pattern


def check_attn_implementation(value: str) -> str:
    """``value`` if transformers would take it as ``attn_implementation`` (a typo fails here, before any
    weights are read, not as a traceback from ``from_pretrained``); never stricter than transformers:
    a kernel it cannot load (flash_attention_2 not installed) fails when the member loads."""
    name = value.removeprefix("paged|")
    if name in ATTN_IMPLEMENTATIONS or re.fullmatch(r"flash_attention_\d+", name) or _HUB_KERNEL.fullmatch(name):
        return value
    registry = sys.modules.get("transformers.modeling_utils")  # loaded wherever a kernel was registered
    if registry is not None and name in registry.ALL_ATTENTION_FUNCTIONS.valid_keys():
        return value
    raise ValueError(f"unknown attn_implementation {value!r}; use one of {', '.join(ATTN_IMPLEMENTATIONS)} "
                     "or a hub kernel (org/repo)")


_UNSET_MEANS: dict[str, object] = {"device": "cpu", "dtype": "float32", "http": HttpSettings()}
"""What a loader does with an option left at None (its signature's default); an in-process
llama.cpp server's own (threads, poll) are added by ``loader_defaults``."""


def _loader(spec: MemberSpec) -> Callable[..., Any]:
    """The function ``members._build`` loads ``spec`` with (whose keywords are ``backend_options``)."""
    from .hf import HFMember
    from .llamacpp import LlamaCppMember
    from .sglang import SGLangMember
    from .vllm import VLLMMember

    if spec.backend == "transformers":
        return HFMember.from_pretrained
    if spec.backend == "llamacpp":
        return LlamaCppMember.__init__ if spec.is_url else LlamaCppMember.from_gguf
    return VLLMMember.__init__ if spec.backend == "vllm" else SGLangMember.__init__


@functools.cache
def loader_defaults(spec: MemberSpec) -> dict[str, object]:
    """What ``spec``'s member loads with when an option is not set, as ``model_dump(mode="json")``
    writes it: read from its loader's own signature (n_ctx=4096, top_k=20, slots, ...) and, for an
    option the loader leaves at None, from what it then runs with (threads: every core), so the two
    cannot drift apart."""
    names = OPTION_FIELDS
    parameters = inspect.signature(_loader(spec)).parameters
    unset = dict(_UNSET_MEANS)
    if spec.backend == "llamacpp" and not spec.is_url:
        from .llamacpp import unset_server_options

        unset.update(unset_server_options())
    defaults = {name: parameters[name].default for name in names if name in parameters}
    defaults = {name: unset.get(name) if value is None else value for name, value in defaults.items()}
    return {name: value.model_dump(mode="json") if isinstance(value, BaseModel) else value
            for name, value in defaults.items() if value is not None and value is not inspect.Parameter.empty}


class MemberDefaults(BaseModel):
    """Engine-wide defaults for members that do not set their own: placement (transformers members)
    and server slots (in-process llama.cpp members)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    device: str | None = None
    """Where the whole model runs: cpu, cuda, cuda:1, mps (default: cpu)."""
    device_map: DeviceMap | None = None
    """Spread one model over devices (accelerate): auto, balanced, sequential or {module: device}."""
    dtype: DType | None = None
    """Weight dtype: float32 (default), bfloat16, float16, or auto (the checkpoint's own)."""
    attn_implementation: str | None = None
    """transformers attention kernel: sdpa, eager, flash_attention_2, ... (default: transformers')."""
    compile: bool | None = None
    """transformers: compile the forward with ``torch.compile`` (inductor, dynamic shapes). Exact, and
    1.04-1.07x faster per token on a 2-core CPU once compiled, but the first request waits 25 s to 2 min
    for the compiler, once per process (docs/members.md): worth it for a server, not for one answer.
    False is the same as unset (it asks for no placement, so a zoo name stays on llama.cpp)."""
    slots: int | None = Field(None, ge=1)
    """In-process llama.cpp: parallel slots, one per active request, each with its own prefix cache
    (default: ``DEFAULT_MAX_ACTIVE``, the requests the server admits at once)."""

    @field_validator("device")
    @classmethod
    def _parsable_device(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                devices.parse_device(value)
            except InvalidRequestError as err:
                raise ValueError(str(err)) from None
        return value

    @field_validator("attn_implementation")
    @classmethod
    def _known_attention(cls, value: str | None) -> str | None:
        return None if value is None else check_attn_implementation(value)

    @field_validator("compile")
    @classmethod
    def _false_is_unset(cls, value: bool | None) -> bool | None:
        return value or None

    @field_validator("device_map")
    @classmethod
    def _known_strategy(cls, value: DeviceMap | None) -> DeviceMap | None:
        if isinstance(value, str) and value not in devices.DEVICE_MAPS:
            raise ValueError(f"unknown device_map {value!r}; use one of {', '.join(devices.DEVICE_MAPS)} "
                             "or a dict of module name -> device")
        return value

    @model_validator(mode="after")
    def _device_or_map(self) -> MemberDefaults:
        if self.device is not None and self.device_map is not None:
            raise ValueError("give device or device_map, not both")
        return self

    def placement(self) -> dict[str, Any]:
        """The placement options that are set."""
        return {k: getattr(self, k) for k in PLACEMENT_FIELDS if getattr(self, k) is not None}


class MemberConfig(MemberDefaults):
    """One ensemble member: which model, on which backend, and how it runs.

    Unknown keys are an error naming the key. Placement fields (device, device_map, dtype,
    attn_implementation) apply to transformers members only; top_k and http to server members
    (llama.cpp, vLLM, SGLang); threads, slots, n_ctx and poll to a GGUF this process serves with llama.cpp;
    reuse_prompt_cache to any llama.cpp member; pin_slots to a llama.cpp member at a URL.
    """

    model: str = Field(min_length=1)
    """A zoo name, local HF folder, .gguf path, hub id (org/name) or spec string (llamacpp:NAME,
    vllm:URL#TOKENIZER, ...; see the members package)."""
    backend: Backend | None = None
    """Backend for a model without a prefix (default: llama.cpp for a zoo name, transformers for the
    rest; transformers for a zoo name given placement options)."""
    name: str | None = Field(None, min_length=1)
    """Display name: how stats, events, the server page and eval summaries call this member, and what
    ``drafter=`` / ``--drafter`` may name (default: the model's name). Unique within an ensemble; it
    changes nothing else (two names for one model share its weights)."""
    top_k: int | None = Field(None, ge=1)
    """Server members: how many of the most likely ids the server returns per position."""
    http: HttpSettings | None = None
    """Server members: timeouts, retries, API key."""
    threads: int | None = Field(None, ge=1)
    """In-process llama.cpp: CPU threads (default: all cores)."""
    n_ctx: int | None = Field(None, ge=16)
    """In-process llama.cpp: context length per slot."""
    poll: int | None = Field(None, ge=0, le=100)
    """In-process llama.cpp: how long its threads busy-wait for the next job after one (0: they
    sleep at once; 100: they spin; llama.cpp's own default 50). Spinning threads take cores from
    another member computing in the meantime (docs/speed.md)."""
    reuse_prompt_cache: bool | None = None
    """llama.cpp: a request's first call reuses the prefix its slot still holds from the previous
    request (a shared system or few-shot prompt is not computed again). Faster, but the prompt is then
    computed in two pieces instead of one batch, which can flip a greedy near-tie: the same request
    can answer differently after different predecessors (default False: every request is computed
    from position 0 and repeats bitwise)."""
    pin_slots: bool | None = None
    """llama.cpp at a URL: lease the server's slots and pin each request to one (``id_slot``), as a
    server this process starts always is. Only for a server no other process uses: two clients that
    both pin queue on the same slot (default: send no slot, llama.cpp picks the idle one holding the
    request's prefix)."""

    @model_validator(mode="after")
    def _options_fit_backend(self) -> MemberConfig:
        try:
            spec = self.spec
        except InvalidRequestError as err:
            raise ValueError(str(err)) from None
        in_process_llamacpp = spec.backend == "llamacpp" and not spec.is_url
        rules = ((PLACEMENT_FIELDS, spec.backend == "transformers", "transformers members"),
                 (SERVER_FIELDS, spec.backend != "transformers", "server members (llamacpp:, vllm:, sglang:)"),
                 (LLAMACPP_FIELDS, in_process_llamacpp, "a GGUF served by llama.cpp in this process (llamacpp:NAME)"),
                 (LLAMACPP_CLIENT_FIELDS, spec.backend == "llamacpp", "llama.cpp members"),
                 (LLAMACPP_URL_FIELDS, spec.backend == "llamacpp" and spec.is_url,
                  "a llama.cpp server at a URL (llamacpp:http://...)"))
        for names, applies, runs in rules:
            given = [name for name in names if getattr(self, name) is not None]
            if given and not applies:
                raise ValueError(f"{', '.join(given)}: only for {runs}, but {self.model!r} runs as {spec}")
        return self

    @property
    def spec(self) -> MemberSpec:
        """The parsed model spec. A model without a prefix runs on ``backend``, else on its default
        (``default_backend``: llama.cpp for a zoo name), except that placement options (device,
        dtype, ...) exist only for transformers members, so asking for one picks transformers."""
        return parse_member_spec(self.model, self.backend or ("transformers" if self.placement() else None))

    @property
    def has_prefix(self) -> bool:
        """Whether ``model`` names its backend itself (``llamacpp:NAME``, ``vllm:URL``)."""
        return split_prefix(self.model)[0] is not None

    def backend_options(self) -> dict[str, Any]:
        """Keyword options for the backend's loader (only those that are set)."""
        names = OPTION_FIELDS
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}

    @property
    def key(self) -> str:
        """Registry key: the spec, plus the options that differ from the loader's defaults (a
        bfloat16 copy of a model is another member than its float32 copy; ``device="cpu"`` is the
        plain one; two engines asking for the same config share one member)."""
        defaults = loader_defaults(self.spec)
        options = {k: v for k, v in self.model_dump(mode="json", include=set(self.backend_options())).items()
                   if defaults.get(k) != v}
        if self.http is not None and self.http.api_key is not None:  # dumped masked: two keys, two members
            digest = hashlib.sha256(self.http.api_key.get_secret_value().encode()).hexdigest()[:16]
            options["http"] = {**options["http"], "api_key": f"sha256:{digest}"}
        return str(self.spec) + (f"?{json.dumps(options, sort_keys=True)}" if options else "")

    def with_defaults(self, defaults: MemberDefaults | None, backend: str | None = None) -> MemberConfig:
        """This config with a default backend (for a model without a prefix) and the engine-wide
        defaults filled in where it sets none: placement for a transformers member, slots for an
        in-process llama.cpp member. A member that sets its own device or device_map keeps it: the
        two are never mixed."""
        values = self.model_dump(exclude_none=True)
        if (self.backend is None and backend is None and defaults is not None and defaults.placement()
                and not self.has_prefix):
            backend = "transformers"  # engine-wide placement is asked for: a zoo name runs where it applies
        if self.backend is None and backend is not None and parse_member_spec(self.model, backend).backend == backend:
            values["backend"] = backend  # a model with its own prefix (llamacpp:NAME) keeps it, and says so
        config = validated(MemberConfig, **values)
        if defaults is None:
            return config
        if config.spec.backend == "llamacpp" and not config.spec.is_url:
            if config.slots is None and defaults.slots is not None:
                return validated(MemberConfig, **{**values, "slots": defaults.slots})
            return config
        if config.spec.backend != "transformers":
            return config
        fill = defaults.placement()
        if config.device is not None or config.device_map is not None:
            fill.pop("device", None)
            fill.pop("device_map", None)
        fill = {k: v for k, v in fill.items() if getattr(config, k) is None}
        return validated(MemberConfig, **{**values, **fill}) if fill else config

    def check_placement(self) -> None:
        """Make sure this machine has the devices asked for (before any weights are read)."""
        if self.device is not None:
            devices.check_device(self.device)
        if self.device_map is not None:
            devices.check_device_map(self.device_map)
        if self.dtype is not None:
            devices.torch_dtype(self.dtype)


_OTHER_MEMBER_NAMES = {"n_threads": "threads", "n_parallel": "slots", "torch_dtype": "dtype"}
"""What llama-cpp-python, llama.cpp's server and transformers call a member option (``member_option_hint``)."""
_NO_SUCH_OPTION = {
    "n_gpu_layers": "no GPU offload option: the llama.cpp server this process starts for a GGUF takes none; "
                    "for a GPU run a member on transformers (members=[MemberConfig(model='transformers:NAME', "
                    "device='cuda')]) or start llama-server with -ngl yourself and name it 'llamacpp:http://HOST:PORT'",
    "model_kwargs": "no model_kwargs: engine options are keywords of their own (draft_length=3, dtype='bfloat16'), "
                    "a member's own settings go in members=[MemberConfig(model=..., n_ctx=...)]",
}
_NO_SUCH_OPTION["ngl"] = _NO_SUCH_OPTION["n_gpu_layers"]
"""Names users bring from other libraries for which nothing here has a field: what to do instead."""


def member_option_hint(name: str, accepted: Sequence[str]) -> str:
    """The hint for an unknown ``name`` that is (or is a close spelling or another library's name of) a
    member option, where ``accepted`` (the names the place it was given takes) has no closer one: the
    name meant where ``accepted`` holds it, else that it is set per member. One rule for every place a
    name is refused (``options.name_hint``: MemberConfig, engine options, member_options, ChatEnsemble's
    and EnsembleLLM's keywords, requests): "n_ctxx" or "n_gpu_layers" got "Extra inputs are not
    permitted" alone, and "n_ctx" given engine-wide did not say where it goes."""
    if name in _NO_SUCH_OPTION:
        return f" ({_NO_SUCH_OPTION[name]})"
    fields = [f for f in MemberConfig.model_fields if f != "model"]
    meant = _OTHER_MEMBER_NAMES.get(name) or (
        name if name in fields else next(iter(difflib.get_close_matches(name, fields, n=1, cutoff=0.75)), None))
    if meant is None:
        return ""
    if meant in accepted:
        return f" (did you mean {meant!r}?)" if meant != name else ""
    guess = f"did you mean {meant!r}? " if meant != name else ""
    return f" ({guess}{meant} is set per member: members=[MemberConfig(model=..., {meant}=...)])"


register_member_names(list(MemberDefaults.model_fields), _OTHER_MEMBER_NAMES, member_option_hint)


def member_config(entry: str | dict[str, Any] | MemberConfig, defaults: MemberDefaults | None = None,
                  backend: str | None = None) -> MemberConfig:
    """A spec string, a dict (from YAML/JSON) or a MemberConfig -> MemberConfig with defaults applied;
    validation errors become the engine's InvalidRequestError, naming the bad key."""
    if isinstance(entry, str):
        config = validated(MemberConfig, model=entry)
    elif isinstance(entry, dict):
        config = validated(MemberConfig, **entry)
    elif isinstance(entry, MemberConfig):
        config = entry
    else:
        raise InvalidRequestError(
            f"a member must be a model name/path, a MemberConfig or a Member, got {type(entry).__name__}")
    return config.with_defaults(defaults, backend)


class UnusedPlacement(NamedTuple):
    """Engine-wide placement options that no member would use, and why (``placement_unused_on``)."""

    options: dict[str, Any]
    """The options given that no member would run with, in ``PLACEMENT_FIELDS`` order."""
    reason: str
    """Why, to end a sentence: "every member here runs on llamacpp, vllm", or "every transformers
    member here sets its own device (a: device='cpu')"."""
    own: bool
    """Whether transformers members are here, each with its own value (else there are none)."""


def _runs_with(member: object, name: str, value: Any) -> bool:
    """Whether ``member`` (engine-wide defaults already filled in) is a transformers member that runs
    with ``name=value``: the engine-wide value filled its unset field (``MemberConfig.with_defaults``:
    each option on its own, device and device_map as one), or its own value is the same anyway."""
    return (isinstance(member, MemberConfig) and member.spec.backend == "transformers"
            and getattr(member, name) == value)


def _on_this_cpu(member: object) -> bool:
    """Whether ``member`` runs on this machine's CPU whatever the engine-wide device: a GGUF served by
    llama.cpp in this process (it has no device setting), or a transformers member whose own device is
    the CPU. A server member runs where its server does and a built member where it was built: unknown."""
    if not isinstance(member, MemberConfig):
        return False
    spec = member.spec
    return ((spec.backend == "llamacpp" and not spec.is_url)
            or (spec.backend == "transformers" and member.device is not None
                and devices.parse_device(member.device).type == "cpu"))


def _own_value(member: MemberConfig, name: str) -> str:
    """A transformers member's own setting that keeps the engine-wide ``name`` from it ("a: device='cpu'")."""
    field = name
    if name in ("device", "device_map"):  # the two are one choice: a member with either keeps it
        field = "device" if member.device is not None else "device_map"
    return f"{member.name or member.model}: {field}={getattr(member, field)!r}"


def placement_unused_on(defaults: MemberDefaults, members: Sequence[object]) -> UnusedPlacement | None:
    """Engine-wide placement options that no member would use (else None). One rule for the engine's
    check below and the CLI's (``member_flags``).

    An option is used where a transformers member runs with it (``_runs_with``): not by llama.cpp,
    server or built members, nor by a transformers member that sets its own value for it (its own
    dtype keeps the engine's dtype from it; its own device or device_map keeps both the engine's
    device and device_map). An unused option is no error where it is provably a no-op: ``device``
    naming the CPU where every member runs on this machine's CPU anyway (``_on_this_cpu``: an
    in-process llama.cpp member, a transformers member whose own device is the CPU), since it asks
    for what happens. The other options stay refused though unused, as they ask for what no such
    member does: dtype (a GGUF has its own quantisation, even dtype='float32' or 'auto' reads no
    transformers checkpoint), device_map (spreads a transformers model only), attn_implementation
    (transformers' kernels; llama.cpp has its own) and compile (torch.compile; False is unset already)."""
    unused = {name: value for name, value in defaults.placement().items()
              if not any(_runs_with(m, name, value) for m in members)
              and not (name == "device" and devices.parse_device(value).type == "cpu"
                       and all(_on_this_cpu(m) for m in members))}
    if not unused:
        return None
    own = [m for m in members if isinstance(m, MemberConfig) and m.spec.backend == "transformers"]
    if not own:
        runs = ", ".join(sorted({m.spec.backend if isinstance(m, MemberConfig) else "built members" for m in members}))
        return UnusedPlacement(unused, f"every member here runs on {runs}", own=False)
    fields = " and ".join(dict.fromkeys("device" if name == "device_map" else name for name in unused))
    values = ", ".join(dict.fromkeys(_own_value(m, name) for m in own for name in unused))
    return UnusedPlacement(unused, f"every transformers member here sets its own {fields} ({values})", own=True)


def check_placement_used(defaults: MemberDefaults, members: Sequence[object]) -> None:
    """Refuse engine-wide placement options (``EnsembleEngine(..., device="cuda")``) that no member
    would use (``placement_unused_on``): they exist for transformers members that set none of their
    own (a llama.cpp member in this process takes no device, a server member runs where its server
    does, a built member was placed when built), so with no such member they were dropped and
    everything ran where it would have anyway, silently. The CLI refuses ``--device`` there alike
    (``member_flags``)."""
    unused = placement_unused_on(defaults, members)
    if unused is None:
        return
    options = ", ".join(f"{name}={value!r}" for name, value in unused.options.items())
    if unused.own:
        raise InvalidRequestError(f"{options}: only for transformers members that set none of their own, and "
                                  f"{unused.reason} (drop it, or unset the member's own)")
    raise InvalidRequestError(f"{options}: only for transformers members, and {unused.reason} "
                              "(drop it, or run a member on transformers: 'transformers:NAME', or a zoo name "
                              "without a prefix)")
