"""``ferry up``: the whole system on one machine, each component its own OS process.

:mod:`.main` (the command: config, processes, the ready file) and
:mod:`.regions` (the layout of several regions); the child processes
themselves are :class:`ferry.procs.Child`, shared with the benchmarks and
the tests.
"""
