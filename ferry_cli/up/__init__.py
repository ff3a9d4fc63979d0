"""``ferry up``: the whole system on one machine, each component its own OS process.

:mod:`.main` (the command: config, processes, the ready file),
:mod:`.regions` (the layout of several regions), :mod:`.traces` (the OTLP
receiver of ``--trace-stdout``) and :mod:`.ready` (when the fleet routes:
also the benchmarks' and tests' wait). The child processes are
:class:`ferry.procs.Child`, restarted by :class:`ferry.supervise.Supervisor`;
a local etcd and throw-away certificates come from the local harness
(:mod:`harness`).
"""
