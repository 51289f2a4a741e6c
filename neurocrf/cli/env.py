"""``neurocrf-env``: what this install has, as Markdown to paste into a bug report.

Versions (neurocrf, Python, torch and its CUDA, Triton, Lightning, transformers, Hydra, numpy), the
compiled CPU kernel (built at install, cached, or unavailable and why), threads, the GPUs with their
compute capability, and for each device the CRF backend that ``backend="auto"`` takes and why; on a
GPU also the Triton kernels' self-check (see :mod:`neurocrf.structs.engine`). The reasons come from
the engine's chooser, so the report says what a run would do.

    neurocrf-env                 # python -m neurocrf.cli.env
    neurocrf-env --no-self-check # skip compiling and checking the Triton kernels on the GPUs
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
from pathlib import Path

PACKAGES = (("neurocrf", "neurocrf"), ("torch", "torch"), ("triton", "triton"), ("pytorch-lightning", "Lightning"),
            ("transformers", "transformers"), ("hydra-core", "Hydra"), ("numpy", "numpy"))
SETTINGS = ("NEUROCRF_CRF_BACKEND", "NEUROCRF_TRITON_SELF_CHECK", "NEUROCRF_COMPILED_KERNEL", "TRITON_INTERPRET",
            "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")


def version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def compiled_kernel() -> str:
    """Where the compiled CPU kernel comes from: built at install, the user cache, or why not."""
    from neurocrf.structs import engine

    try:
        kernel = engine.load("compiled").kernel
    except engine.BackendError as error:
        return f"unavailable: {error}"
    name = kernel.library_name()
    if Path(kernel.__file__).with_name(name).exists():
        return "built at install"
    cached = (kernel._cache_dir() / name).exists()
    reason = kernel.unavailable()
    if reason is not None:
        return f"unavailable: {reason}"
    return f"cached in {kernel._cache_dir()}" if cached else f"built now into {kernel._cache_dir()}"


def report(self_check: bool = True) -> str:
    """The Markdown report."""
    import torch

    from neurocrf.structs import engine

    lines = ["## neurocrf environment", "", "| | |", "|---|---|", f"| Python | {platform.python_version()} "
             f"({sys.platform}) |"]
    for distribution, label in PACKAGES:
        extra = f", CUDA {torch.version.cuda or 'none (CPU build)'}" if distribution == "torch" else ""
        lines.append(f"| {label} | {version(distribution)}{extra} |")
    lines.append(f"| compiled CPU kernel | {compiled_kernel()} |")
    lines.append(f"| threads | torch {torch.get_num_threads()} of {os.cpu_count()} CPUs |")
    settings = ", ".join(f"`{key}={os.environ[key]}`" for key in SETTINGS if key in os.environ)
    lines.append(f"| settings | {settings or 'none'} |")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    lines.append(f"| Triton kernels | {triton_status(gpus)} |")
    lines += ["", "### Devices and the CRF backend `backend=\"auto\"` takes", ""]
    if not gpus:
        lines.append("No GPU: " + ("torch is a CPU build" if torch.version.cuda is None
                                   else "torch finds no CUDA device") + ".")
        lines.append("")
    lines += ["| device | backend | why |", "|---|---|---|"]
    devices = [("cpu", "CPU")] + [(f"cuda:{i}", _gpu(i)) for i in range(gpus)]
    for device, label in devices:
        for order, kind in ((1, "first order"), (2, "pair states")):
            name, why = engine.auto_choice(device, order, check=self_check and device != "cpu")
            lines.append(f"| {label}, {kind} | {name} | {'; '.join(why)} |")
    checks = engine.self_checks()
    if checks:
        lines += ["", "### Self-checks", "", "| kernels | result |", "|---|---|"]
        lines += [f"| {what} | {result} |" for what, result in checks.items()]
    return "\n".join(lines)


def triton_status(gpus: int) -> str:
    """Whether ``"auto"`` can take the Triton kernels here, and if not why (from the engine)."""
    from neurocrf.structs import engine

    reasons = []
    state = engine.describe()["triton"]
    if state != "available":
        reasons.append(state)
    else:
        gate = engine.load("triton").auto_reason()
        if gate is not None:
            reasons.append(gate + " ('auto' uses torch on CUDA; backend='triton' still runs them)")
    if not gpus:
        reasons.append("no CUDA device: the kernels run on CUDA tensors (on CPU only in Triton's interpreter, "
                       "for tests)")
    return "used by 'auto' on CUDA tensors" if not reasons else "not used: " + "; ".join(reasons)


def _gpu(index: int) -> str:
    import torch

    properties = torch.cuda.get_device_properties(index)
    return (f"cuda:{index} {properties.name} (compute capability {properties.major}.{properties.minor}, "
            f"{properties.total_memory / 2 ** 30:.0f} GiB)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="neurocrf-env", description=__doc__.splitlines()[0])
    parser.add_argument("--no-self-check", action="store_true",
                        help="do not compile and check the Triton kernels on the GPUs")
    args = parser.parse_args(argv)
    print(report(self_check=not args.no_self_check))


if __name__ == "__main__":
    main()
