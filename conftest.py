"""Collection rules for the whole checkout (the docstring examples of neurocrf/ are collected too)."""

import importlib.util

# The Triton kernel modules import triton at the top; without triton (an optional dependency) they
# are left out of the doctest collection, and the backend reports "triton is not installed".
collect_ignore_glob = [] if importlib.util.find_spec("triton") else [
    "neurocrf/structs/engine/triton/kernels.py", "neurocrf/structs/engine/triton/blocked.py"]
