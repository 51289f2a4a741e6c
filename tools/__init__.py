"""Operator tools: the GPU check, the multi-process soak and diagnostics, run from the repository
root (``bash tools/gpu_check.sh``, ``python -m tools.triton_precision --help``). The commands:
``tools/README.md``."""
