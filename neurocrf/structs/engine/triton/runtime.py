"""Loading and launching the kernels of :mod:`.kernels`: compiled for CUDA tensors, or run by
Triton's CPU interpreter.

``triton.jit`` decides at decoration time whether a function is compiled or interpreted (it reads
``TRITON_INTERPRET`` then). So that both work in one process whatever the import order, the
kernels module is executed once per mode, under its own module name, with ``TRITON_INTERPRET``
forced for the duration: :func:`kernels` returns the compiled or the interpreted set. The mode of
a call is read when the call is made: the interpreter when ``TRITON_INTERPRET`` is set (Triton's
own rule), compiled kernels otherwise (CUDA tensors only).

Kernel choice (:func:`plan`): a state space whose transition tile ``C^order * C`` (times the rank
block for k best) fits :data:`MAX_TILE` runs the single-tile kernels of :mod:`.kernels`, held
entirely in registers; larger ones run the blocked kernels of :mod:`.blocked`, which loop over
blocks of at most :data:`BLOCK_TILE` elements and keep the row's state vectors in a scratch buffer.
Either way one call launches one kernel per quantity.

Every launch goes through :func:`launch`, which counts launches per kernel in :data:`LAUNCHES`
(the tests check that a call launches the same number of kernels at every sequence length).
"""

from __future__ import annotations

import collections
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

MIN_TRITON = (3, 2)
MAX_TILE = 16384
"""Largest transition tile ``C^order * C`` (times the power-of-two rank block for k best) that the
single-tile kernels keep on chip; larger state spaces run the blocked kernels."""
BLOCK_TILE = 4096
"""Elements of one block tile ``[BA, BB, BC]`` (times the rank block) of the blocked kernels; the
backward kernel in float64 (which holds about three such tiles at once) takes half as many, so
that it does not spill (float64 is also the compute dtype of long sequences)."""
BLOCKED = {"forward_kernel": "forward_blocked_kernel", "backward_kernel": "backward_blocked_kernel",
           "search_kernel": "search_blocked_kernel"}
"""The blocked variant of each kernel (one more argument: the per-row scratch buffer)."""
MAX_KEY = 1 << 30
"""Search keys ``state * k + rank`` must stay below this (int32 back-pointers)."""
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

LAUNCHES: collections.Counter[str] = collections.Counter()
"""Kernel launches so far, per kernel name (interpreted and compiled alike)."""

_KERNELS: dict[bool, ModuleType] = {}
_KERNELS_FILE = Path(__file__).with_name("kernels.py")


def available() -> str | None:
    """None when triton is installed and recent enough, else a one-line reason."""
    try:
        import triton
    except ImportError as error:
        return f"triton is not installed ({error}); pip install 'triton>={MIN_TRITON[0]}.{MIN_TRITON[1]}'"
    try:
        version = tuple(int(part) for part in triton.__version__.split(".")[:2])
    except ValueError:
        return None
    if version < MIN_TRITON:
        return f"triton {triton.__version__} is too old: the kernels need triton >= {MIN_TRITON[0]}.{MIN_TRITON[1]}"
    return None


def interpreting() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's CPU interpreter (read at every call)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def _load(path: Path, interpret: bool) -> ModuleType:
    name = f"{__package__}._{path.stem}_{'interpreted' if interpret else 'compiled'}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernels(interpret: bool) -> ModuleType:
    """The kernels module, decorated for the interpreter or for compilation (built once per mode),
    with the blocked kernels of :mod:`.blocked` (loaded in the same mode) among its attributes."""
    if interpret not in _KERNELS:
        previous = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
        try:
            module = _load(_KERNELS_FILE, interpret)
            blocked = _load(_KERNELS_FILE.with_name("blocked.py"), interpret)
        finally:
            if previous is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = previous
        blocked.base = module  # its kernels call the helpers of the same mode
        for name in BLOCKED.values():
            setattr(module, name, getattr(blocked, name))
        _KERNELS[interpret] = module
    return _KERNELS[interpret]


def launch(name: str, rows: int, *args, **constants) -> None:
    """Launch kernel ``name`` with one program per batch row (counted in :data:`LAUNCHES`), on the
    device of its tensors (not necessarily the current CUDA device)."""
    interpret = interpreting()
    kernel = getattr(kernels(interpret), name)
    device = next(arg.device for arg in args if isinstance(arg, Tensor))
    if device.type == "cuda" and not interpret:
        with torch.cuda.device(device):
            kernel[(rows,)](*args, **constants)
    else:
        kernel[(rows,)](*args, **constants)
    LAUNCHES[name] += 1


def carve(device: torch.device, *parts: tuple[tuple[int, ...], torch.dtype], zero: bool = False) -> list[Tensor]:
    """Tensors of the given shapes and dtypes as views of one allocation (``zero``: zero-filled):
    one allocator call (one aten op, one launch for the fill) instead of one per tensor. Each part
    starts on a 16-byte boundary."""
    offsets, total = [], 0
    for shape, dtype in parts:
        offsets.append(total)
        size = dtype.itemsize
        for dim in shape:
            size *= dim
        total += -(-size // 16) * 16
    memory = (torch.zeros if zero else torch.empty)(max(total, 16), dtype=torch.uint8, device=device)
    out = []
    for offset, (shape, dtype) in zip(offsets, parts):
        count = 1
        for dim in shape:
            count *= dim
        out.append(memory[offset:offset + count * dtype.itemsize].view(dtype).view(shape))
    return out


def next_power_of_2(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def blocks(size: int, order: int) -> dict[str, int]:
    """Block sizes of the two state layouts (see :mod:`.kernels`) for ``C = size``."""
    block = next_power_of_2(size)
    return {"ORDER": order, "BA": block, "BB": block if order == 2 else 1, "BC": block}


def tile_elements(size: int, order: int, k: int = 1) -> int:
    """Elements of the largest tile a program holds: ``[BA, BB, BC]`` times the rank block."""
    shape = blocks(size, order)
    return shape["BA"] * shape["BB"] * shape["BC"] * next_power_of_2(k)


WARPS = {"forward_kernel": (16, 16), "backward_kernel": (4, 8), "search_kernel": (16, 16)}
"""Per kernel: target tile elements per thread and the most warps. The backward kernel holds about
three times as many tiles at once, and 8 warps keep its register budget at 255 per thread (16
warps cap it at 128). Chosen with tools/triton_resources.py so that no kernel spills at the sizes
the backend runs, but the largest search tiles."""


def num_warps(kernel: str, elements: int) -> int:
    """Warps per program: one for small state spaces (reductions stay inside a warp), more as the
    tile grows (:data:`WARPS`)."""
    per_thread, most = WARPS[kernel]
    return max(1, min(most, next_power_of_2(elements // (32 * per_thread))))


def blocked_blocks(size: int, order: int, k: int = 1, share: int = 1) -> dict[str, int]:
    """Block sizes of the blocked kernels for ``C = size``: ``BC`` last components of the
    destination layout (at most 256, fewer with many ranks), then ``BA`` source components and
    (order 2) ``BB`` middle components, about square, so that ``BA * BB * BC * BK`` is at most
    :data:`BLOCK_TILE` / ``share`` (``BK``, the rank block, is not split)."""
    full, ranks = next_power_of_2(size), next_power_of_2(k)
    budget = max(1, BLOCK_TILE // share // ranks)
    last = min(full, 256, max(1, budget // 16))
    rest = max(1, budget // last)
    if order == 1:
        return {"ORDER": 1, "BA": min(full, rest), "BB": 1, "BC": last}
    source = min(full, next_power_of_2(int(rest ** 0.5)))
    return {"ORDER": 2, "BA": source, "BB": min(full, max(1, rest // source)), "BC": last}


def plan(kernel: str, size: int, order: int, k: int = 1, wide: bool = False) -> tuple[str, dict[str, int]]:
    """The kernel function to launch for ``kernel`` (its single-tile or blocked variant) and its
    launch constants: block sizes, ``BK`` for search, ``num_warps`` (``wide``: the compute dtype
    is float64)."""
    ranks = next_power_of_2(k) if kernel == "search_kernel" else 1
    if tile_elements(size, order, ranks) <= MAX_TILE:
        name, shape = kernel, blocks(size, order)
    else:
        share = 2 if wide and kernel == "backward_kernel" else 1
        name, shape = BLOCKED[kernel], blocked_blocks(size, order, ranks, share)
    elements = shape["BA"] * shape["BB"] * shape["BC"] * ranks
    if kernel == "search_kernel":
        shape["BK"] = ranks
    return name, {**shape, "num_warps": num_warps(kernel, elements)}


def position_block(seq_len: int) -> int:
    """Positions per block of the kernels' on-chip compaction of a mask row (and of their -1 fill)."""
    return min(1024, next_power_of_2(max(seq_len, 16)))


def emission_strides(emissions: Tensor, order: int) -> tuple[int, int, int, int]:
    """``(batch, position, middle, last)`` element strides of ``emissions [B, T, *S]`` in the
    destination layout (order 1, and emissions read through columns ``[B, T, C']``, have no
    middle component)."""
    stride = emissions.stride()
    if order == 1 or emissions.dim() == 3:
        return stride[0], stride[1], 0, stride[2]
    return stride[0], stride[1], stride[2], stride[3]


def unsupported(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor, k: int = 1
                ) -> str | None:
    """None when the kernels run on these inputs, else why not (one line)."""
    reason = available()
    if reason is not None:
        return reason
    tensors = (start, transitions, end, emissions, lengths)
    if any(x.device != emissions.device for x in tensors):
        return "start, transitions, end, emissions and lengths must be on one device"
    if not emissions.is_cuda and not interpreting():
        return "the triton backend needs CUDA tensors (or TRITON_INTERPRET=1 for Triton's CPU interpreter)"
    order = start.dim()
    if order not in (1, 2):
        return f"the triton kernels run first-order and pair state spaces, not order {order}"
    for name, x in zip(("start", "transitions", "end", "emissions"), tensors):
        if x.dtype not in FLOAT_DTYPES:
            return f"{name} has dtype {x.dtype}; the triton kernels take float16, bfloat16, float32 or float64"
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        return f"lengths must be an integer tensor, got {lengths.dtype}"
    size = transitions.shape[-1]
    states = size ** order
    if states * size >= 1 << 31:
        return (f"{states} states x {size} components make {states * size} transitions per position, "
                f"past the kernels' int32 offsets")
    if states * k >= MAX_KEY:
        return f"{states} states x k = {k} ranks reach the search's int32 key limit ({MAX_KEY})"
    if next_power_of_2(k) > BLOCK_TILE:
        return f"k = {k} ranks do not fit one block of {BLOCK_TILE} elements"
    return None
