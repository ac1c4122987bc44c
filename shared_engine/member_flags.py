"""The command-line flags that describe members, shared by run, bench, serve and eval:
``--models a,b`` or ``--members FILE`` (a YAML or JSON list of ``MemberConfig``), plus
``--device`` / ``--device-map`` / ``--dtype`` / ``--attn-implementation`` / ``--compile`` for every transformers
member that does not set its own. Parsing only: the configs are the engine's ``MemberConfig``.

    # members.yaml
    - model: qwen2.5-coder-0.5b-instruct
      dtype: bfloat16
    - llamacpp:smollm2-135m-instruct        # a plain spec string is a member too
    - {model: "vllm:http://gpu-box:8000", top_k: 20}
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import EnsembleError, InvalidRequestError
from .members import MemberConfig, MemberDefaults, member_config, with_backend
from .members.config import placement_unused_on
from .members.devices import DTYPES
from .options import validated

BACKEND_HELP = ("how models without a backend prefix run: llamacpp or transformers (default: llamacpp "
                "for zoo names, transformers for the rest and for members given --device/--dtype/...)")


def _models(value: str) -> list[str]:
    models = [m.strip() for m in value.split(",") if m.strip()]
    if not models:
        raise argparse.ArgumentTypeError("give at least one model")
    return models


def read_members_file(path: str | Path) -> list[MemberConfig]:
    """A YAML (``.yaml``/``.yml``) or JSON file holding a list of members (dicts or spec strings),
    or a mapping with that list under ``members``. Errors name the file, the entry and the key."""
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8-sig")  # a BOM (Windows editors) is no JSON/YAML error
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise ValueError(f"{path}, line {line}: not UTF-8 text") from None
    if str(path).endswith((".yaml", ".yml")):
        import yaml

        try:
            data: Any = yaml.safe_load(text)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f", line {mark.line + 1}" if mark is not None else ""
            raise ValueError(f"{path}{where}: not valid YAML ({str(err).splitlines()[0]})") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {err.lineno}: not valid JSON ({err.msg}, column {err.colno})") from None
    if isinstance(data, dict) and set(data) == {"members"}:
        data = data["members"]
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a non-empty list of members (dicts or model names)")
    configs = []
    for number, entry in enumerate(data, 1):
        try:
            configs.append(member_config(entry))
        except EnsembleError as err:
            raise ValueError(f"{path}, member {number}: {err}") from None
    return configs


class _MembersFile(argparse.Action):
    """``--members FILE``: parsed at once (a bad file stops the command before anything loads);
    ``args.models`` gets the members' names so every command can name them."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, value: Any,
                 option_string: str | None = None) -> None:
        try:
            configs = read_members_file(value)
        except (OSError, ValueError) as err:
            parser.error(f"--members: {err}")
        namespace.members = configs
        namespace.models = [c.model for c in configs]


def add_member_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """``--models`` or ``--members`` (one of them ``required``), and the placement defaults."""
    which = parser.add_mutually_exclusive_group(required=required)
    which.add_argument("--models", type=_models,
                       help="comma-separated zoo names, local HF folders, .gguf paths, hub ids (org/name) or "
                            "member specs such as llamacpp:NAME, vllm:URL#TOKENIZER (see README, Remote members)")
    which.add_argument("--members", action=_MembersFile, metavar="FILE",
                       help="YAML or JSON list of members, each a model spec or a MemberConfig "
                            "(model, device, dtype, ...; see README, Members)")
    parser.add_argument("--device", help="transformers members: cpu, cuda, cuda:1, mps (default: cpu)")
    parser.add_argument("--device-map", help="transformers members: spread each model over devices "
                                             "(auto, balanced, sequential)")
    parser.add_argument("--dtype", choices=DTYPES, help="transformers members' weights (default: float32)")
    parser.add_argument("--attn-implementation", help="transformers attention kernel (sdpa, eager, ...)")
    parser.add_argument("--compile", action="store_true", default=None,
                        help="transformers members: torch.compile the forward (exact; a few percent faster per "
                             "token on a CPU, after 25 s to 2 min of compiling per process)")


def member_configs(args: argparse.Namespace, backend: str | None = None) -> list[MemberConfig]:
    """The members the flags describe: ``--members`` entries or ``--models`` names (``backend`` for
    those without a prefix), with ``--device``/``--dtype``/... filled in where a member sets none, and
    ``serve --max-active N`` giving every in-process llama.cpp member N slots (one per active request)."""
    defaults = validated(
        MemberDefaults, device=getattr(args, "device", None), device_map=getattr(args, "device_map", None),
        dtype=getattr(args, "dtype", None), attn_implementation=getattr(args, "attn_implementation", None),
        compile=getattr(args, "compile", None), slots=getattr(args, "max_active", None))
    entries: Sequence[str | MemberConfig] = getattr(args, "members", None) or [
        with_backend(m, backend) for m in args.models]
    configs = [member_config(entry, defaults, backend) for entry in entries]
    _check_placement_applies(defaults, configs, getattr(args, "backend", None))
    return configs


def _check_placement_applies(defaults: MemberDefaults, configs: Sequence[MemberConfig], asked: object) -> None:
    """``--device``/``--dtype``/... that no member would use would do nothing (``--backend llamacpp
    --device cuda`` ran on the CPU, silently; so did ``--device cuda:3`` beside a members file whose every
    transformers member sets its own device): an error naming the flags, as a members file's ``dtype``
    for a llama.cpp member is. The rule is the engine's (``placement_unused_on``: ``--device cpu`` where
    every member runs on the CPU anyway passes). ``bench --backend transformers,llamacpp`` applies them
    to its transformers run."""
    unused = placement_unused_on(defaults, configs)
    if unused is None or (isinstance(asked, list) and "transformers" in asked):
        return
    flags = ", ".join(f"--{name.replace('_', '-')}" for name in unused.options)
    if unused.own:
        raise InvalidRequestError(f"{flags}: only for transformers members that set none of their own, and "
                                  f"{unused.reason} (drop the flag, or the members file's own value)")
    raise InvalidRequestError(f"{flags}: only for transformers members, and {unused.reason} "
                              "(drop the flag, or run a member on transformers: --backend transformers)")
