"""The step-time parameters of the engine model fitted from interval samples (pure; numpy).

The model (docs/engine.md): a step takes ``prefill_base + per_token x tokens
prefilled`` if it prefills, plus ``decode_base + per_request x requests
decoding`` if it decodes. Summed over an interval, the time in steps is

    T = prefill_base x S_p + per_token x P + decode_base x S_d + per_request x D

with S_p the steps that prefilled, P the tokens prefilled, S_d the steps
that decoded and D the requests decoding summed over steps: linear in the
four parameters (:data:`PARAMS`, named as ``agent.replica.engine.EngineParams``
names them). :func:`fit_steps` estimates them from many intervals by least
squares, non-negative (Lawson and Hanson's active-set NNLS on the columns
scaled to unit norm), and reports:

- per parameter its value and standard error (``sigma^2 (X_f' X_f)^-1`` over
  the parameters not held at the bound 0, ``sigma^2`` = residual sum of
  squares / (samples - those parameters); none when no degree of freedom is
  left or the value sits at 0);
- the fit's error: ``relative_rms`` = sqrt(sum r^2 / sum T^2) and
  ``r2`` = 1 - SS_res / SS_tot (None when T is constant);
- parameters the samples cannot tell, instead of a number: a column that is
  zero in every sample (no step ever prefilled: neither prefill parameter;
  only fully cached prompts: no per-token cost), or columns in a fixed
  proportion in every sample (the scaled design matrix's singular values
  under ``RANK_TOLERANCE`` times the largest; the columns of their singular
  vectors are named). The fit then keeps a largest independent set of the
  columns (so the other parameters stay unbiased) and reports none of the
  confounded ones.

Intervals without a step (idle) carry nothing and are left out. Cost:
O(samples) with four columns; a 4,096-sample fit takes well under a
millisecond of numpy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

PARAMS = ("prefill_base_seconds", "prefill_seconds_per_token", "decode_base_seconds",
          "decode_seconds_per_request")
COLUMNS = ("steps that prefilled", "tokens prefilled", "steps that decoded", "requests decoding")
RANK_TOLERANCE = 1e-9  # a singular value under this times the largest is a confounded direction
NULL_SHARE = 1e-6  # a column's share of such a direction that names it among the confounded

Matrix: TypeAlias = npt.NDArray[np.float64]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Interval:
    """One interval of one replica: the four counts and the time its steps took."""

    prefill_steps: float
    prefill_tokens: float
    decode_steps: float
    decode_tokens: float
    step_seconds: float

    def row(self) -> tuple[float, float, float, float]:
        return (self.prefill_steps, self.prefill_tokens, self.decode_steps, self.decode_tokens)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParamFit:
    """One parameter: its value and standard error, or why the samples cannot tell it."""

    name: str
    value: float | None  # None: not identifiable
    stderr: float | None = None
    reason: str = ""

    @property
    def identifiable(self) -> bool:
        return self.value is not None


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepFit:
    """The fit of :data:`PARAMS` over some intervals."""

    params: tuple[ParamFit, ...]
    samples: int  # intervals with at least one step
    relative_rms: float | None = None
    r2: float | None = None
    step_seconds: float = 0.0  # T summed

    def values(self) -> dict[str, float]:
        """The identifiable parameters by name."""
        return {p.name: p.value for p in self.params if p.value is not None}

    def param(self, name: str) -> ParamFit:
        return next(p for p in self.params if p.name == name)


def fit_steps(intervals: Sequence[Interval]) -> StepFit:
    """The non-negative least-squares fit of :data:`PARAMS` to ``intervals`` (see the module docstring)."""
    rows = [i for i in intervals if any(v > 0 for v in i.row())]
    if not rows:
        return StepFit(params=tuple(ParamFit(name=n, value=None, reason="no samples") for n in PARAMS), samples=0)
    x = np.array([i.row() for i in rows], dtype=np.float64)
    y = np.array([i.step_seconds for i in rows], dtype=np.float64)
    reasons = _unidentifiable(x)
    basis = _basis(x, skip={j for j, why in reasons.items() if why.startswith("no ")})
    norms = np.linalg.norm(x[:, basis], axis=0)
    scaled = x[:, basis] / norms
    coef = nnls(scaled, y)
    residual = y - scaled @ coef
    ss_res = float(residual @ residual)
    ss_y = float(y @ y)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    free = [k for k in range(len(basis)) if coef[k] > 0]
    dof = len(rows) - len(free)
    stderr: dict[int, float] = {}
    if free and dof > 0:
        sub = scaled[:, free]
        try:
            cov = (ss_res / dof) * np.linalg.inv(sub.T @ sub)
        except np.linalg.LinAlgError:
            cov = None
        if cov is not None:
            for pos, k in enumerate(free):
                stderr[basis[k]] = math.sqrt(max(0.0, float(cov[pos, pos]))) / float(norms[k])
    value = {basis[k]: float(coef[k] / norms[k]) for k in range(len(basis))}
    params = []
    for j, name in enumerate(PARAMS):
        if j in reasons:
            params.append(ParamFit(name=name, value=None, reason=reasons[j]))
        else:
            params.append(ParamFit(name=name, value=value[j], stderr=stderr.get(j)))
    return StepFit(params=tuple(params), samples=len(rows),
                   relative_rms=math.sqrt(ss_res / ss_y) if ss_y > 0 else None,
                   r2=1.0 - ss_res / ss_tot if ss_tot > 0 else None, step_seconds=float(y.sum()))


def _unidentifiable(x: Matrix) -> dict[int, str]:
    """Column index -> why the samples cannot tell its parameter."""
    reasons: dict[int, str] = {}
    zero = [j for j in range(x.shape[1]) if not np.any(x[:, j] > 0)]
    for j in zero:
        if j in (0, 1) and 0 in zero:
            reasons[j] = "no step prefilled"
        elif j == 1:
            reasons[j] = "no token prefilled (only fully cached prompts)"
        else:
            reasons[j] = "no step decoded"
    live = [j for j in range(x.shape[1]) if j not in reasons]
    if not live:
        return reasons
    scaled = x[:, live] / np.linalg.norm(x[:, live], axis=0)
    _, s, vt = np.linalg.svd(scaled, full_matrices=True)
    s = np.concatenate([s, np.zeros(len(live) - len(s))])  # fewer samples than columns: those directions too
    for i, sv in enumerate(s):
        if sv > RANK_TOLERANCE * s[0]:
            continue
        involved = [live[k] for k in range(len(live)) if abs(vt[i, k]) > NULL_SHARE]
        for j in involved:
            others = ", ".join(COLUMNS[o] for o in involved if o != j)
            reasons.setdefault(j, f"{COLUMNS[j]} in a fixed proportion to {others} in every sample"
                               if others else f"{COLUMNS[j]} cannot be told apart")
    return reasons


def _basis(x: Matrix, skip: set[int]) -> list[int]:
    """A largest set of linearly independent columns (in order), leaving out ``skip``."""
    chosen: list[int] = []
    for j in range(x.shape[1]):
        if j in skip:
            continue
        trial = [*chosen, j]
        sub = x[:, trial] / np.linalg.norm(x[:, trial], axis=0)
        s = np.linalg.svd(sub, compute_uv=False)
        if len(s) == len(trial) and s[-1] > RANK_TOLERANCE * s[0]:
            chosen = trial
    return chosen


def nnls(a: Matrix, b: Matrix, *, max_iterations: int = 100) -> Matrix:
    """argmin ||a x - b|| subject to x >= 0 (Lawson and Hanson's active set; a few columns)."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(np.float64).eps * np.linalg.norm(a, 1) * max(a.shape)
    w = a.T @ (b - a @ x)
    for _ in range(max_iterations):
        if passive.all() or not np.any(w[~passive] > tol):
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        for _ in range(max_iterations):
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if np.all(z[passive] > 0):
                x = z
                break
            negative = passive & (z <= 0)
            alpha = float(np.min(x[negative] / (x[negative] - z[negative])))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
            if not passive.any():
                break
        w = a.T @ (b - a @ x)
    return x
