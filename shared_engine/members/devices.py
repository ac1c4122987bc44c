"""Everything device- and dtype-dependent about in-process (transformers) members, in one place.

The rest of the engine never names a device: it asks this module to check a placement before
loading, to put input ids where a model's embeddings live, and to bring logits rows home. A CUDA
run therefore differs from a CPU run only in the device string the user gives, and the CPU tests
exercise every function here.

What crosses devices per scored position: one logits row of the member's vocabulary, copied to
the CPU as float32 (Qwen2.5: 151,936 x 4 B = 0.6 MB; SmolLM2: 49,152 x 4 B = 0.2 MB). A draft
block of ``k`` tokens is scored in one forward and crosses as one ``[k + 1, vocab]`` copy. Hidden
states and KV caches stay on the member's device.

torch is imported where a function needs it, so that reading a member's configuration (the command
line's flags, a profile) does not wait for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..errors import InvalidRequestError

if TYPE_CHECKING:
    import torch

DType = Literal["float32", "bfloat16", "float16", "auto"]
DTYPES: tuple[str, ...] = get_args(DType)
"""Weight dtypes a transformers member loads in; ``auto`` keeps the checkpoint's own dtype."""

DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
"""The strategies accelerate accepts for ``device_map``; a dict maps module names to devices."""

_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}

def torch_dtype(name: str) -> torch.dtype | str:
    """``"bfloat16"`` -> ``torch.bfloat16``; ``"auto"`` stays ``"auto"`` (the checkpoint's dtype)."""
    import torch

    if name not in DTYPES:
        raise InvalidRequestError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}")
    return name if name == "auto" else getattr(torch, name)


def parse_device(device: str) -> torch.device:
    """``device`` as torch reads it (any machine: this only checks the spelling)."""
    import torch

    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidRequestError(f"unknown device {device!r} (e.g. cpu, cuda, cuda:1, mps)") from exc


def check_device(device: str) -> torch.device:
    """Parse ``device`` and make sure this machine has it, before any weights are read.

    ``cpu``, ``cuda``, ``cuda:N``, ``mps``."""
    import torch

    parsed = parse_device(device)
    if parsed.type == "cpu":
        return parsed
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InvalidRequestError(f"device {device!r} needs CUDA, but this machine has no CUDA device "
                                      f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})")
        if parsed.index is not None and parsed.index >= count:
            raise InvalidRequestError(f"device {device!r} does not exist: this machine has {count} CUDA "
                                      f"device(s), cuda:0..cuda:{count - 1}")
        return parsed
    if parsed.type == "mps":
        if not torch.backends.mps.is_available():
            raise InvalidRequestError(f"device {device!r} needs Apple's MPS, which this machine does not have")
        return parsed
    raise InvalidRequestError(f"device type {parsed.type!r} is not supported; use cpu, cuda[:N] or mps")


def check_device_map(device_map: str | dict[str, Any]) -> None:
    """A strategy name, or a module -> device dict whose devices must exist here."""
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAPS:
            raise InvalidRequestError(f"unknown device_map {device_map!r}; use one of {', '.join(DEVICE_MAPS)} "
                                      "or a dict of module name -> device")
        return
    for target in device_map.values():
        if isinstance(target, int):
            check_device(f"cuda:{target}")
        elif target not in ("disk",):
            check_device(str(target))


def input_device(model: Any) -> torch.device:
    """Where a model's input ids must go: its (first) embedding's device, also under a device_map.

    An embedding that a device_map offloads ('disk', or 'cpu' under accelerate on a GPU machine) has
    its weight on ``meta``; accelerate's hook brings it in on its execution device, where the ids
    must be too (ids on ``meta`` failed the first forward: "Cannot copy out of meta tensor")."""
    import torch

    embeddings = model.get_input_embeddings()
    device = embeddings.weight.device
    if device.type != "meta":
        return device
    execution = getattr(getattr(embeddings, "_hf_hook", None), "execution_device", None)
    if isinstance(execution, int):  # accelerate names a GPU by its index
        return torch.device("cuda", execution)
    return torch.device(execution if execution is not None else "cpu")


def to_host(logits: torch.Tensor) -> torch.Tensor:
    """Logits rows for consensus and fusion: on the CPU, in float32, whatever the member ran in.

    The one place where rows leave a member's device (see the module docstring for the cost); consensus
    and fusion meet on the CPU."""
    import torch

    return logits.to(device="cpu", dtype=torch.float32)


def stored_weight_bytes(folder: Path) -> int:
    """Size of a checkpoint's weight files on disk (safetensors or PyTorch bins)."""
    files = list(folder.glob("*.safetensors")) or list(folder.glob("*.bin"))
    return sum(f.stat().st_size for f in files)


def estimated_weight_bytes(folder: Path, dtype: str) -> int:
    """Bytes the weights take once loaded in ``dtype``: the files' size scaled from the dtype the
    checkpoint was saved in (config.json) to the requested one."""
    size = stored_weight_bytes(folder)
    if dtype == "auto":
        return size
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return size
    saved = str(config.get("dtype") or config.get("torch_dtype") or "float32").removeprefix("torch.")
    return size * _BYTES[dtype] // _BYTES.get(saved, 4)


def available_bytes(device: torch.device) -> int:
    """Memory a new member could still use on ``device``: free GPU memory, or the host's
    MemAvailable (Linux; elsewhere the check is skipped by returning a huge number)."""
    import torch

    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 2**62


def placement_device(device: str | None, device_map: str | dict[str, Any] | None) -> torch.device | None:
    """The one device a member's weights all land on, or None when a device_map spreads them."""
    import torch

    if device_map is not None:
        return None
    return torch.device(device or "cpu")


def _indexed(device: torch.device) -> torch.device:
    """``cuda`` as the device it means (``cuda:0`` unless another is current): one GPU, one budget."""
    import torch

    if device.type == "cpu" or device.index is not None:
        return device
    current = torch.cuda.current_device() if device.type == "cuda" and torch.cuda.is_available() else 0
    return torch.device(device.type, current)


def check_fits(planned: list[tuple[str, torch.device, int]]) -> None:
    """Refuse members that together cannot fit on their device, before loading any of them.

    ``planned``: (member, device, estimated weight bytes). Only weights are counted (KV caches and
    activations come on top), so this catches the impossible, not the tight."""
    by_device: dict[torch.device, list[tuple[str, int]]] = {}
    for name, device, size in planned:
        by_device.setdefault(_indexed(device), []).append((name, size))
    for device, members in by_device.items():
        need = sum(size for _, size in members)
        have = available_bytes(device)
        if need > have:
            listed = ", ".join(f"{name} {size / 2**30:.1f} GiB" for name, size in members)
            raise InvalidRequestError(
                f"the members' weights do not fit on {device}: {listed} = {need / 2**30:.1f} GiB, but only "
                f"{have / 2**30:.1f} GiB is available there; use a smaller dtype (bfloat16), another device, "
                "or device_map='auto'")
