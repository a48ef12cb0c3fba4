"""What a step costs, learnt from the steps the engine runs.

The `objective` policy bounds what runs beside a latency-critical call so that
the call's time per token stays within a factor of what it would be alone. The
products' timings (`corps.engine.model.tuning`) see only the weights: on a CPU a
step's time also grows with each call it carries (its attention over its own
view, its planning and sampling), with each prompt chunk, and with the keys
its decodes attend over. So the loop reports every step it runs, and this model
fits

    seconds = a + b * calls + c * P(rows) + d * chunks + e * K / 1000

(chunks: the calls that encode a prompt chunk rather than one token; K: the
keys the step's decodes read, `exec.step_plan.decode_keys`) by least squares over the recent
steps (older ones weigh less), each coefficient >= 0. Without K a step of four
decodes over 1500-token views was predicted as one over 100-token views, and
measured 1.9x slower (78 against 42 ms on the default model): a chat with a long
history, or beside long workflows, ran past its bound.
P(rows) is the rows themselves, or where the engine timed its product kernels
(dtype auto on a CPU) their measured seconds for that many rows
(`KernelChoice.products`): a step's products are not linear in its rows there
(one row may run a gemv twice as fast as two rows' gemm), and a line through
them would misjudge exactly the small steps a latency call runs in.
It predicts nothing until it has seen steps of at least two sizes, and refits
every `REFIT` steps (the fit is a few hundred microseconds of Python).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import combinations

#: Each step's weight decays by this much per later step: the fit follows the last
#: few hundred steps (what the machine does now, with the load it has now).
DECAY = 0.995
#: Ridge term relative to the data's scale: keeps the fit defined on few sizes.
RIDGE = 1e-9
#: Steps observed between two fits.
REFIT = 16
N = 5  # features: 1, calls, P(rows), chunks, keys / 1000
KEYS_UNIT = 1000.0


@dataclass
class StepCost:
    """An online least-squares fit of a step's seconds on its calls and rows."""

    decay: float = DECAY
    #: P(rows): what a step's rows cost (None: the rows themselves)
    products: Callable[[int], float] | None = None
    _xx: list[list[float]] = field(default_factory=lambda: [[0.0] * N for _ in range(N)])
    _xy: list[float] = field(default_factory=lambda: [0.0] * N)
    _sizes: set[tuple[int, int, int]] = field(default_factory=set)
    _coef: tuple[float, ...] | None = None
    _since: int = 0  # steps observed since the last fit

    def observe(
        self, calls: int, rows: int, seconds: float, chunks: int = 0, keys: int = 0
    ) -> None:
        """One step that ran `calls` calls over `rows` rows in `seconds`, `chunks`
        of the calls encoding prompt chunks, its decodes reading `keys` keys."""
        bad = calls < 1 or rows < calls or not 0 <= chunks <= calls or keys < 0
        if bad or not seconds > 0:
            return
        x = (1.0, float(calls), self._p(rows), float(chunks), keys / KEYS_UNIT)
        for i in range(N):
            self._xy[i] = self.decay * self._xy[i] + x[i] * seconds
            for k in range(N):
                self._xx[i][k] = self.decay * self._xx[i][k] + x[i] * x[k]
        if len(self._sizes) < 2:
            self._sizes.add((calls, rows, chunks))
            self._coef = None
        self._since += 1
        if self._since >= REFIT:
            self._coef = None

    @property
    def ready(self) -> bool:
        return len(self._sizes) >= 2

    def coefficients(self) -> tuple[float, ...] | None:
        """(a, b, c, d, e), each >= 0 (c per unit of P, e per 1000 keys); None before
        steps of two sizes."""
        if not self.ready:
            return None
        if self._coef is None:
            self._coef, self._since = _nonnegative_fit(self._xx, self._xy), 0
        return self._coef

    def predict(self, calls: int, rows: int, chunks: int = 0, keys: int = 0) -> float | None:
        """Seconds of a step of `calls` calls over `rows` rows, `chunks` of them
        prompt chunks, its decodes reading `keys` keys; None before `ready`."""
        coef = self.coefficients()
        if coef is None:
            return None
        a, b, c, d, e = coef
        return a + b * calls + c * self._p(rows) + d * chunks + e * keys / KEYS_UNIT

    def max_rows(
        self, calls: int, chunks: int, seconds: float, most: int, keys: int = 0
    ) -> int | None:
        """The most rows (<= `most`) a step of `calls` calls and `chunks` chunks whose
        decodes read `keys` keys may hold within `seconds` (P taken as rising with
        rows); 0 if not even one row fits; None before `ready`."""
        if self.predict(calls, 1, chunks, keys) is None:
            return None
        lo, hi = 0, most  # predict(lo) fits (lo = 0 by convention), find the last that does
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.predict(calls, mid, chunks, keys) <= seconds:  # type: ignore[operator]
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _p(self, rows: int) -> float:
        return float(rows) if self.products is None else self.products(rows)


def _nonnegative_fit(xx: list[list[float]], xy: list[float]) -> tuple[float, ...]:
    """argmin |X theta - y|^2 (+ a small ridge) over theta >= 0, from the normal
    equations: each subset of free coefficients is solved, the best feasible kept."""
    n = len(xy)
    ridge = RIDGE * max(xx[i][i] for i in range(n))
    best, best_loss = (0.0,) * n, 0.0  # theta = 0: loss |y|^2, i.e. 0 here
    for size in range(1, n + 1):
        for free in combinations(range(n), size):
            a = [[xx[i][k] + (ridge if i == k else 0.0) for k in free] for i in free]
            sol = _solve(a, [xy[i] for i in free])
            if sol is None or any(v < 0 for v in sol):
                continue
            theta = [0.0] * n
            for i, v in zip(free, sol, strict=True):
                theta[i] = v
            quad = sum(theta[i] * xx[i][k] * theta[k] for i in range(n) for k in range(n))
            loss = quad - 2 * sum(t * y for t, y in zip(theta, xy, strict=True))  # - |y|^2
            if loss < best_loss:
                best, best_loss = tuple(theta), loss
    return best


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """x with a x = b (n <= 5) by Gaussian elimination with pivoting; None if singular."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [v - f * w for v, w in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]
