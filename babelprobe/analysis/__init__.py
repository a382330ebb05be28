"""Analysis: joins, accuracy tables with intervals, correlations, peak layers, figures."""

from babelprobe.analysis.summary import accuracy_pivot, accuracy_table, wilson

__all__ = ["accuracy_pivot", "accuracy_table", "wilson"]
