"""The router canary's guard: a sequential probability ratio test on paired windows (pure: no I/O, no clock).

Each comparison window (``window_seconds``, 5 s by default) the leader sums
the usage reports of the canary proxies (those that ran the candidate for
the whole report) and of the baseline proxies (the baseline version), per
group: requests, errors, and the TTFT p99 and p50 (each report's quantile
weighted by its TTFT samples: an approximation of the pooled quantile, fair
to both groups alike). A window **counts** when each group has at least
``min_requests`` requests and some TTFT samples. A counted window is **bad**
when

- the canary's TTFT p99 exceeds ``ttft_p99_ratio`` (1.25) x the baseline's, or
- the canary's error rate exceeds the baseline's by more than
  ``error_increase_pp`` (0.5) percentage points.

Counted windows are Bernoulli trials: "no harm" (H0) makes a window bad with
probability at most ``P0`` (0.2: noise alone), "harm" (H1) with at least
``P1`` (0.8: a canary that is really worse by the guard's margin loses most
windows). ``min_requests`` is what makes P0 hold: the p99 of few requests is
their maximum and noisy. With lognormal TTFTs (sigma 0.5) and identical
configs, ``tests/controlplane/test_routerconfig.py`` measures a bad window
with probability 0.22 at 20 requests per group, 0.15 at 100, 0.08 at 200
(the default) and 0.04 at 400; a canary twice as slow makes 94 %, 98 %,
99.8 % and 100 % of them bad. A smaller minimum needs a larger ratio (the
drill uses 10 requests and a ratio of 2). Wald's SPRT sums per window the log likelihood ratio

    bad:  +ln(P1 / P0)             = +1.386
    good: +ln((1 - P1) / (1 - P0)) = -1.386

and rolls back when the sum reaches ``A = ln((1 - BETA) / ALPHA)`` (4.55, with
``ALPHA`` 0.01 the false-rollback rate of one test from 0 and ``BETA`` 0.05 the
missed-harm rate). It accepts "no harm" at ``B = ln(BETA / (1 - ALPHA))``
(-2.99) but does not stop there: the sum is held at B (a CUSUM-like floor)
and the test goes on until ``min_seconds`` (60 s) have passed, so harm that
starts late is still caught. **Promotion**: the sum is at B and
``min_seconds`` have passed. **Rollback**: the sum reaches A; or a proxy
refuses the candidate (at once, elsewhere); or ``max_seconds`` (600 s) pass
without a decision: no evidence either way is not evidence of safety (the
operator may promote by hand).

Why this test: TTFT quantiles are not normal and windows hold few requests,
so a test on the windows' sign (worse by the margin or not) needs no
distribution; the SPRT takes the fewest windows on average for given error
rates, and its bounds hold whatever the stopping time.

**Bounds.** From 0, Wald's inequality bounds a false rollback by
``e^-A`` (1.05 %) when a window is bad with probability at most P0 under no
harm. Each return to the floor B starts a new excursion that reaches A with
probability at most ``e^-(A - B)`` (0.05 %); a test of ``n`` counted
windows has at most ``n`` of them, so over ``max_seconds`` at the defaults
(120 windows) a false rollback is at most 1.05 % + 120 x 0.05 % = 7.4 % by
this union bound (a loose one: an excursion needs six bad windows in a row
from the floor, 0.2^6 = 0.006 %).

**Promise.** A canary that is bad in every counted window is rolled back at
the 4th counted window after the start (4 x 1.386 = 5.5 > A): within
``4 x window_seconds`` (20 s at the defaults) of both groups reaching
``min_requests`` per window; one that turns bad after a healthy stretch,
at the 6th (from the floor, (A - B) / 1.386 = 5.4). A healthy one is
promoted at ``min_seconds`` if three counted windows have passed (3 good
windows reach the floor).
"""

from __future__ import annotations

import dataclasses
import math

P0 = 0.2     # a window is bad with at most this probability when the canary does no harm
P1 = 0.8     # ... at least this when it does
ALPHA = 0.01  # false rollback (one test from 0)
BETA = 0.05   # missed harm
BAD_STEP = math.log(P1 / P0)
GOOD_STEP = math.log((1 - P1) / (1 - P0))
ROLLBACK_AT = math.log((1 - BETA) / ALPHA)
PROMOTE_AT = math.log(BETA / (1 - ALPHA))


@dataclasses.dataclass(frozen=True, slots=True)
class Guard:
    """The per-rollout guard; see the module docstring for the meaning and defaults."""

    ttft_p99_ratio: float = 1.25
    error_increase_pp: float = 0.5
    min_requests: int = 200
    min_seconds: float = 60.0
    max_seconds: float = 600.0
    window_seconds: float = 5.0

    def check(self) -> Guard:
        """Itself, or ``ValueError`` naming the field (``guard.<name>``) out of range."""
        if not 1.0 <= self.ttft_p99_ratio <= 100.0:
            raise ValueError("guard.ttft_p99_ratio: must be 1..100")
        if not 0.0 <= self.error_increase_pp <= 100.0:
            raise ValueError("guard.error_increase_pp: must be 0..100")
        if not 1 <= self.min_requests <= 1_000_000:
            raise ValueError("guard.min_requests: must be 1..1000000")
        if not 0.1 <= self.window_seconds <= 3600.0:
            raise ValueError("guard.window_seconds: must be 0.1..3600")
        if not 0.0 <= self.min_seconds <= self.max_seconds <= 7 * 86_400.0:
            raise ValueError("guard.max_seconds: need 0 <= min_seconds <= max_seconds <= 7 days")
        if self.max_seconds < self.window_seconds:
            raise ValueError("guard.max_seconds: must be at least one window_seconds")
        return self


@dataclasses.dataclass(slots=True)
class Group:
    """One group's sums over a window."""

    requests: int = 0
    errors: int = 0
    ttft_samples: int = 0
    ttft_p99_sum: float = 0.0  # each report's p99 x its TTFT samples
    ttft_p50_sum: float = 0.0

    def add(self, requests: int, errors: int, ttft_samples: int, ttft_p99: float, ttft_p50: float) -> None:
        self.requests += requests
        self.errors += errors
        self.ttft_samples += ttft_samples
        self.ttft_p99_sum += ttft_p99 * ttft_samples
        self.ttft_p50_sum += ttft_p50 * ttft_samples

    @property
    def ttft_p99(self) -> float:
        return self.ttft_p99_sum / self.ttft_samples if self.ttft_samples else 0.0

    @property
    def ttft_p50(self) -> float:
        return self.ttft_p50_sum / self.ttft_samples if self.ttft_samples else 0.0

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


def judge(guard: Guard, canary: Group, baseline: Group) -> bool | None:
    """Whether a window is bad (True), good (False), or does not count (None: a group lacks requests)."""
    if min(canary.requests, baseline.requests) < guard.min_requests or not (canary.ttft_samples
                                                                          and baseline.ttft_samples):
        return None
    slower = canary.ttft_p99 > guard.ttft_p99_ratio * baseline.ttft_p99
    failing = canary.error_rate - baseline.error_rate > guard.error_increase_pp / 100.0
    return slower or failing


@dataclasses.dataclass(slots=True)
class Test:
    """The SPRT's state: the log likelihood ratio (held at :data:`PROMOTE_AT` from below), windows counted."""

    llr: float = 0.0
    windows: int = 0
    bad: int = 0

    def step(self, bad: bool) -> None:
        """One counted window."""
        self.windows += 1
        self.bad += bad
        self.llr = max(PROMOTE_AT, self.llr + (BAD_STEP if bad else GOOD_STEP))


PROMOTE = "promote"
ROLLBACK = "rollback"


def decide(guard: Guard, test: Test, elapsed: float) -> tuple[str, str] | None:
    """(``promote`` | ``rollback``, the reason) when the test or the time decides, else None."""
    if test.llr >= ROLLBACK_AT:
        return ROLLBACK, (f"the guard detected harm: {test.bad} of {test.windows} windows worse than "
                          f"TTFT p99 x {guard.ttft_p99_ratio:g} or errors + {guard.error_increase_pp:g} pp "
                          f"(llr {test.llr:.2f} >= {ROLLBACK_AT:.2f})")
    if test.llr <= PROMOTE_AT and elapsed >= guard.min_seconds:
        return PROMOTE, (f"the guard accepted no harm: {test.bad} of {test.windows} windows worse "
                         f"(llr {test.llr:.2f} <= {PROMOTE_AT:.2f}) after {elapsed:.0f} s")
    if elapsed >= guard.max_seconds:
        return ROLLBACK, (f"undecided after {guard.max_seconds:g} s ({test.windows} windows counted, "
                          f"{test.bad} worse): no evidence of safety")
    return None
