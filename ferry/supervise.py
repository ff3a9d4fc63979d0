"""Supervision of child processes: reap, log, restart with backoff, give up on a crash loop.

One mechanism for ``ferry up``'s children and for the workers of ``ferry
proxy --workers N`` (:mod:`dataplane.workers`); ``name`` (``ferry up``) prefixes
its lines on standard error and ``metric`` names its restart counter.
:class:`Supervisor` is polled by its owner's main loop (every 0.2 s).
A child found dead is reaped (``Popen.poll``) and logged as the structured
event ``child_exited`` (``component``, ``pid``, ``exit_status``: the code, or
``-N`` for signal N, with ``signal`` naming it); its restart is scheduled
after a delay from its own :class:`ferry.backoff.Backoff` (``initial`` 0.5 s,
``cap`` 10 s, equal jitter), reset once the child has run ``stable_seconds``
(30 s) before dying. The restart runs the same argv with the child's bound
address pinned (``--listen 127.0.0.1:0`` becomes the address it had: clients,
proxies and agents keep their target; a proxy behind a shared ``SO_REUSEPORT``
port joins its siblings again), and etcd restarts on its own data dir and
ports (:class:`harness.etcd.LocalEtcd`; this one restart waits for etcd's
health, up to 15 s, the others return at once and their ready file is read on
later polls); event ``child_restarted`` with the new pid. A child that died
``give_up_after`` times (5) within ``window_seconds`` (60 s) is given up
on: event ``child_given_up`` at ERROR and one line on standard error naming
it and its log; it is not started again.

Restarts are counted per component in ``restarts`` (what ``ferry up`` writes
into its ready file, with the new pids) and in the Prometheus counter
``metric`` (``ferry_up_restarts_total{component}``) of the supervisor's own registry; the
label set is the run's fixed set of component names (rule 10).

:class:`CrashLoop` is the pure part (death times in a sliding window, an
injected clock); the rest is the edge. Cost per poll: O(children).
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from ferry.backoff import Backoff
from ferry.logs import event
from ferry.procs import Child, ChildFailed

log = logging.getLogger("ferry.supervise")


class CrashLoop:
    """Whether a component keeps dying: ``limit`` deaths within ``window`` seconds (a sliding window)."""

    def __init__(self, limit: int = 5, window: float = 60.0) -> None:
        if limit < 1 or window <= 0:
            raise ValueError(f"crash loop needs limit >= 1 and window > 0, got {limit} and {window}")
        self.limit = limit
        self.window = window
        self._deaths: deque[float] = deque(maxlen=limit)

    def died(self, now: float) -> bool:
        """Record a death at ``now``; True when it is the ``limit``-th within ``window`` seconds."""
        self._deaths.append(now)
        return len(self._deaths) == self.limit and now - self._deaths[0] <= self.window


@dataclass
class _Watch:
    """What the supervisor keeps per child: its backoff, crash loop, restarts and schedule."""

    child: Child
    backoff: Backoff
    loop: CrashLoop
    started: float
    restarts: int = 0
    due: float | None = None  # when a dead child is to be started again
    given_up: bool = False
    announced: bool = field(default=True)  # its ready file was read since the last start


def pinned(args: list[str], address: str | None, flag: str = "--listen") -> list[str]:
    """``args`` with ``flag``'s value replaced by ``address`` (the one the child bound), if both exist."""
    if not address or flag not in args:
        return list(args)
    out = list(args)
    out[out.index(flag) + 1] = address
    return out


def exit_fields(code: int | None) -> dict[str, Any]:
    """``exit_status`` (and ``signal``'s name when a signal ended the process) of a reaped child."""
    fields: dict[str, Any] = {"exit_status": code}
    if code is not None and code < 0:
        try:
            fields["signal"] = signal.Signals(-code).name
        except ValueError:
            fields["signal"] = str(-code)
    return fields


class Supervisor:
    """Restarts children when they die, with backoff and a crash-loop limit (see the module)."""

    def __init__(self, children: list[Child], *, on_change: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic, initial: float = 0.5, cap: float = 10.0,
                 give_up_after: int = 5, window_seconds: float = 60.0, stable_seconds: float = 30.0,
                 registry: CollectorRegistry | None = None, name: str = "ferry up",
                 metric: str = "ferry_up_restarts_total") -> None:
        self.name = name
        self._clock = clock
        self._on_change = on_change
        self.stable_seconds = stable_seconds
        now = clock()
        self._watches = [_Watch(c, Backoff(initial, cap), CrashLoop(give_up_after, window_seconds), now)
                         for c in children]
        self.registry = registry if registry is not None else CollectorRegistry()
        self._counter = Counter(metric, f"Children of {name} restarted after they died",
                                ["component"], registry=self.registry)
        for c in children:
            self._counter.labels(component=c.name)

    @property
    def restarts(self) -> dict[str, int]:
        """Restarts so far per component name."""
        return {w.child.name: w.restarts for w in self._watches}

    @property
    def given_up(self) -> list[str]:
        """Components given up on (a crash loop)."""
        return [w.child.name for w in self._watches if w.given_up]

    def poll(self) -> None:
        """Reap and schedule dead children, start the ones due, and note new ready files; calls ``on_change``."""
        changed = False
        for w in self._watches:
            if w.given_up:
                continue
            now = self._clock()
            child = w.child
            if w.due is None and not child.alive() and child.proc is not None:
                changed |= self._died(w, now)
            if w.due is not None and now >= w.due:
                self._restart(w)
                changed = True
            if not w.announced and child.alive():
                payload = child.check_ready()
                if payload is not None:
                    child.ready = payload
                    w.announced = True
                    changed = True
        if changed:
            self._on_change()

    def _died(self, w: _Watch, now: float) -> bool:
        child = w.child
        code = child.returncode()
        event(log, "child_exited", logging.WARNING, component=child.name, pid=child.pid, **exit_fields(code),
              uptime_seconds=round(now - w.started, 3))
        if now - w.started >= self.stable_seconds:
            w.backoff.reset()
        if w.loop.died(now):
            w.given_up = True
            event(log, "child_given_up", logging.ERROR, component=child.name, deaths=w.loop.limit,
                  window_seconds=w.loop.window)
            print(f"{self.name}: giving up on {child.name}: it died {w.loop.limit} times within "
                  f"{w.loop.window:.0f} s (last exit status {code}); see {child.log_path}", file=sys.stderr,
                  flush=True)
            return True
        w.due = now + w.backoff.next_delay()
        return False

    def _restart(self, w: _Watch) -> None:
        child = w.child
        old = child.pid
        for key, flag in (("grpc", "--listen"), ("http", "--http-listen")):  # a proxy keeps both its addresses
            address = child.ready.get(key) if isinstance(child.ready.get(key), str) else None
            child.args = pinned(child.args, address, flag)
        w.due = None
        w.started = self._clock()
        previous = dict(child.ready)
        try:
            child.start()  # clears child.ready: the last one stands (same address) until the new one is read
            child.ready = child.ready or previous
        except ChildFailed as exc:  # etcd waits for its health; a failed start is one more death
            event(log, "child_restart_failed", logging.WARNING, component=child.name, error=str(exc)[:500])
            return
        w.restarts += 1
        w.announced = False
        self._counter.labels(component=child.name).inc()
        event(log, "child_restarted", logging.WARNING, component=child.name, old_pid=old, pid=child.pid,
              restarts=w.restarts)
        print(f"{self.name}: {child.name} restarted (pid {child.pid}, restart {w.restarts})", flush=True)
