"""Multi-seed studies: the runs of a sweep, their report (tables, significance, plot) and the
corpus statistics behind the precursor-induced CRF."""

from neurocrf.study.report import build_report, format_markdown, write_report
from neurocrf.study.runs import Cell, find_cells, variant_name
from neurocrf.study.significance import UnitCounts, approximate_randomization, sentence_counts

__all__ = [
    "Cell", "UnitCounts", "approximate_randomization", "build_report", "find_cells", "format_markdown",
    "sentence_counts", "variant_name", "write_report",
]
