"""``ferry up``: the whole system on one machine, each component its own OS process.

:mod:`.main` (the command: config, processes, the ready file),
:mod:`.regions` (the layout of several regions), :mod:`.supervise` (restarts
of children that die, with backoff and a crash-loop limit) and
:mod:`.status` (the ready file's supervision section, for ``ferryctl``); the child processes
themselves are :class:`ferry.procs.Child`, shared with the benchmarks and
the tests.
"""
