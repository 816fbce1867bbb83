"""Benchmark results: the document ``bench`` writes and ``report``/``compare`` read.

``schema`` (the pydantic models), ``store`` (atomic reading and writing of
``DIR/results.json``), ``provenance``, ``evidence`` (the server's side of a point),
``aggregate`` (per load level, and the precision target) and ``stats`` (percentiles,
Student-t intervals, Welch's test).  Nothing here imports ``servebook.bench``: a report
reads JSON files only, never the load generator.
"""
