"""Timing of neurocrf against its peers, run as modules from the repository root
(``python -m benchmarks.crf --help``); the shared timing, machine and worker code is
:mod:`benchmarks.common`. The commands: ``benchmarks/README.md``."""
