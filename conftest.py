"""Collection rules for the whole checkout (the docstring examples of neurocrf/ are collected too)."""

import importlib.util

# The Triton kernels module imports triton at the top; without triton (an optional dependency) it
# is left out of the doctest collection, and the backend reports "triton is not installed".
collect_ignore_glob = [] if importlib.util.find_spec("triton") else ["neurocrf/structs/engine/triton/kernels.py"]
