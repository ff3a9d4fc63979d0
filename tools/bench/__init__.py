"""Benchmarks: each prints its figures and writes ``bench-results/*.json``.

Real time against real processes: :mod:`.overhead`, :mod:`.store`,
:mod:`.peers`, :mod:`.tiers` (with :mod:`.tiers_real`), :mod:`.regions`
(with :mod:`.regions_real`), :mod:`.batch`, :mod:`.gang`.
"""
