"""The runs and table makers behind docs/results.md, run as modules from the repository root
(``python -m reproductions.alpino --help``). The commands: ``reproductions/README.md``."""
