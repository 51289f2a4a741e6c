"""Compile the Triton kernels ahead of time for a CUDA target, without a GPU, and read their resources.

Triton's interpreter accepts programs that the GPU compiler refuses (globals that are not
constexpr, shapes its layouts cannot express); compiling every kernel for real targets catches
those on any machine. :func:`compile_kernel` builds one kernel for a compute capability with the
launch constants :mod:`neurocrf.structs.engine.triton.runtime` would choose (``lean``: the options
of the layers' masked NLL and search, see :func:`Case.options`); :func:`resource_usage` reads registers and spill
bytes from the cubin with ``cuobjdump -res-usage`` (shipped in Triton's NVIDIA backend): registers
that do not fit go to the thread's stack frame in local memory (``STACK``, plus ``LOCAL`` arrays).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from neurocrf.structs.engine.triton import runtime

__all__ = ["KERNELS", "Case", "compile_kernel", "nvidia_tool", "resource_usage"]

KERNELS = ("forward_kernel", "backward_kernel", "search_kernel")
_TYPES = {"float32": "fp32", "float64": "fp64", "bfloat16": "bf16", "float16": "fp16"}
# pointer arguments: "pot" the compute dtype, "em" the emissions' dtype, else a fixed Triton type
_POINTERS = {
    "start_ptr": "pot", "moves_ptr": "pot", "end_ptr": "pot", "em_ptr": "em", "len_ptr": "i64",
    "logz_ptr": "fp64", "alpha_ptr": "pot", "scale_ptr": "fp64", "grad_ptr": "fp64", "d_em_ptr": "pot",
    "d_start_ptr": "fp64", "d_end_ptr": "fp64", "pointer_ptr": "i32", "states_ptr": "i64", "scores_ptr": "fp64",
    "mask_ptr": "i1", "pos_ptr": "i32", "col_ptr": "i64", "tag_ptr": "i64", "auto_ptr": "i32", "gold_ptr": "i32",
    "nll_ptr": "fp32", "norm_ptr": "fp64", "label_ptr": "i64",
}


@dataclass(frozen=True)
class Case:
    """One kernel specialisation: state components ``size`` (C), ``order``, ranks ``k`` (search),
    per-position transitions, compute dtype and emissions dtype (names of torch dtypes)."""

    kernel: str
    size: int
    order: int = 1
    k: int = 1
    per_position: bool = False
    dtype: str = "float32"
    emissions: str = "float32"
    lean: bool = False

    def plan(self) -> tuple[str, dict[str, int]]:
        """The kernel function the backend launches for this case and its constants (see
        :func:`.runtime.plan`)."""
        return runtime.plan(self.kernel, self.size, self.order, self.k, wide=self.dtype == "float64")

    @property
    def blocked(self) -> bool:
        return self.plan()[0] != self.kernel

    def options(self) -> dict[str, int]:
        """The kernel's options: all off, or (``lean``) those of the layers' masked NLL (the gold
        path through an automaton, emission columns) and masked search (labels)."""
        lean = int(self.lean)
        options = {"MASKED": lean, "COLUMNS": lean, "BT": 64}
        if self.kernel == "forward_kernel":
            options.update(STORE=True, GOLD=2 * lean, NORMALIZE=0)
        elif self.kernel == "backward_kernel":
            options.update(MOVES=True, GOLD=lean, MASKED=2 * lean)
        else:
            options["LABELS"] = lean
        return options

    def constants(self) -> dict[str, object]:
        constants: dict[str, object] = {**self.plan()[1], "PER_POSITION": self.per_position, **self.options()}
        del constants["num_warps"]
        return constants

    def num_warps(self) -> int:
        return self.plan()[1]["num_warps"]

    def signature(self, arg_names: list[str]) -> dict[str, str]:
        constants = self.constants()
        kinds = {**_POINTERS, "d_moves_ptr": "pot" if self.per_position else "fp64",
                 "work_ptr": "fp64" if self.kernel == "search_kernel" else "pot"}
        signature = {}
        for name in arg_names:
            if name in constants:
                signature[name] = "constexpr"
            elif name in kinds:
                kind = kinds[name]
                kind = _TYPES[self.dtype] if kind == "pot" else _TYPES[self.emissions] if kind == "em" else kind
                signature[name] = "*" + kind
            else:
                signature[name] = "i32"
        return signature

    def __str__(self) -> str:
        extra = (f" k={self.k}" if self.kernel == "search_kernel" else "") + (" blocked" if self.blocked else "")
        where = (" per-position" if self.per_position else "") + (" lean" if self.lean else "")
        emissions = f" ({self.emissions} emissions)" if self.emissions != self.dtype else ""
        return f"{self.kernel} C={self.size} order={self.order}{extra}{where} {self.dtype}{emissions}"


def compile_kernel(case: Case, arch: int):
    """The compiled kernel (``.asm`` holds ``ptx`` and ``cubin``) for ``sm_<arch>``."""
    import triton
    from triton.backends.compiler import GPUTarget

    fn = getattr(runtime.kernels(False), case.plan()[0])
    source = triton.compiler.ASTSource(fn, case.signature(fn.arg_names), case.constants())
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": case.num_warps()})


def nvidia_tool(name: str) -> str | None:
    """Path of a CUDA binary tool shipped with Triton (ptxas, cuobjdump), or on PATH."""
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    return str(bundled) if bundled.exists() else shutil.which(name)


def resource_usage(cubin: bytes) -> dict[str, int]:
    """``{"registers": .., "spill_bytes": .., "shared_bytes": ..}`` of a cubin (cuobjdump
    -res-usage: REG; STACK + LOCAL, the per-thread local memory, are the spills; SHARED)."""
    tool = nvidia_tool("cuobjdump")
    if tool is None:
        raise FileNotFoundError("cuobjdump not found (Triton's backends/nvidia/bin or PATH)")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        text = subprocess.run([tool, "-res-usage", str(path)], capture_output=True, text=True, check=True).stdout
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text))
    if "REG" not in fields:
        raise ValueError(f"no resource usage in cuobjdump output: {text!r}")
    return {"registers": int(fields["REG"]),
            "spill_bytes": int(fields.get("STACK", 0)) + int(fields.get("LOCAL", 0)),
            "shared_bytes": int(fields.get("SHARED", 0))}
