"""Full-batch L-BFGS with MALLET/CRFsuite-style convergence tests and per-iteration accounting.

:class:`FullBatchLBFGS` is ``torch.optim.LBFGS`` (two-loop recursion, strong-Wolfe line search)
driven one iteration at a time, so that every iteration can be timed, counted and tested for
convergence::

    optimizer = FullBatchLBFGS(model.parameters(), history_size=10, tolerance_change=1e-4)
    while not optimizer.finished:
        optimizer.step(closure)            # `iterations_per_step` iterations (default 1)
    optimizer.converged, optimizer.reason, optimizer.history[-1]

``closure()`` zeroes the gradients, evaluates the *whole* objective (sum NLL + prior) with its
gradient and returns the loss. Driving ``torch.optim.LBFGS`` with ``max_iter=1`` naively costs one
extra objective evaluation per iteration (each ``step`` call re-evaluates the point the previous
line search ended on); here the line search's evaluations are remembered and the one it accepted
is handed back instead of recomputed, so an iteration costs exactly its line-search evaluations
(usually one).

Convergence (checked after every iteration ``k`` with objective ``f_k``, gradient ``g_k``, weights
``w_k``):

- objective: ``(f_{k-period} - f_k) / max(|f_k|, 1e-10) <= tolerance_change`` (CRFsuite's delta
  test; with ``period=1`` it is MALLET's relative-change test);
- gradient: ``||g_k|| / max(||w_k||, 1) <= tolerance_grad`` (CRFsuite's epsilon test);
- a line search that finds no lower point, or no descent direction: the run stops, and counts as
  converged only if the last objective change or the gradient was already within tolerance.

``max_iterations`` caps the total iterations: reaching it without converging sets
``finished=True, converged=False, reason="iteration limit"``; the caller must report it (the
Tagger warns and logs ``train/lbfgs_converged = 0``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim.lbfgs import LBFGS

Closure = Callable[[], Tensor]


class FullBatchLBFGS(LBFGS):
    """L-BFGS over the full training objective, one accounted iteration at a time.

    Args:
        params: the parameters (one group).
        lr: initial step length of every line search (1.0 is right for L-BFGS).
        history_size: number of correction pairs kept (MALLET: 4, CRFsuite: 6).
        line_search_fn: ``"strong_wolfe"`` (recommended) or None (fixed steps of ``lr``).
        max_line_search: evaluations allowed per line search.
        tolerance_change: relative objective decrease over ``period`` iterations under which the
            run has converged (0 disables the test).
        period: iterations the objective test looks back over.
        tolerance_grad: ``||g|| / max(||w||, 1)`` under which the run has converged (0 disables).
        max_iterations: total iteration limit (None: no limit; the caller's epochs cap the run).
        iterations_per_step: iterations one :meth:`step` call runs at most.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1.0,
        history_size: int = 10,
        line_search_fn: str | None = "strong_wolfe",
        max_line_search: int = 25,
        tolerance_change: float = 1e-4,
        period: int = 1,
        tolerance_grad: float = 1e-5,
        max_iterations: int | None = None,
        iterations_per_step: int = 1,
    ) -> None:
        if period < 1 or iterations_per_step < 1 or max_line_search < 1:
            raise ValueError("period, iterations_per_step and max_line_search must be >= 1")
        if max_iterations is not None and max_iterations < 1:
            raise ValueError(f"max_iterations must be >= 1 or None, got {max_iterations}")
        if tolerance_change < 0 or tolerance_grad < 0:
            raise ValueError("tolerance_change and tolerance_grad must be >= 0")
        # torch's own stopping tests are switched off (we test after every single iteration);
        # max_eval bounds the line search of the one iteration each inner call runs.
        super().__init__(
            params,
            lr=lr,
            max_iter=1,
            max_eval=1 + max_line_search,
            tolerance_grad=0.0,
            tolerance_change=1e-30,
            history_size=history_size,
            line_search_fn=line_search_fn,
        )
        self.tolerance_change = float(tolerance_change)
        self.period = int(period)
        self.tolerance_grad = float(tolerance_grad)
        self.max_iterations = None if max_iterations is None else int(max_iterations)
        self.iterations_per_step = int(iterations_per_step)
        self.iterations = 0
        self.evaluations = 0
        self.converged = False
        self.finished = False
        self.reason = ""
        self.history: list[dict[str, float]] = []  # one record per iteration
        self._objectives: list[float] = []  # f_0 (start), f_1, ... for the period test
        self._cache: tuple[list[int], float, Tensor] | None = None  # (param versions, f, grad)
        self._trials: list[tuple[float, float, Tensor]] = []

    # ------------------------------------------------------------------ plumbing

    def _versions(self) -> list[int]:
        return [p._version for p in self._params]

    def _set_flat_grad(self, flat: Tensor) -> None:
        offset = 0
        for p in self._params:
            numel = p.numel()
            p.grad = flat[offset : offset + numel].view_as(p).clone()
            offset += numel

    def _directional_evaluate(self, closure: Closure, x: list[Tensor], t: float, d: Tensor) -> tuple[float, Tensor]:
        loss, flat_grad = super()._directional_evaluate(closure, x, t, d)
        self._trials.append((float(t), loss, flat_grad))
        self.evaluations += 1
        return loss, flat_grad

    def _weight_norm(self) -> float:
        return math.sqrt(sum(float(p.detach().double().pow(2).sum()) for p in self._params))

    # ------------------------------------------------------------------ one iteration

    def _iterate(self, closure: Closure) -> float:
        """Run one L-BFGS iteration; return the objective at the new point."""
        cached = self._cache if self._cache is not None and self._cache[0] == self._versions() else None
        self._cache = None
        start: list[tuple[float, Tensor]] = []

        def first_evaluation() -> Tensor:
            if cached is not None:
                _, loss, flat = cached
                self._set_flat_grad(flat)
                start.append((loss, flat))
                return torch.tensor(loss, dtype=torch.float64)
            loss = closure()
            self.evaluations += 1
            start.append((float(loss.detach()), self._gather_flat_grad()))
            return loss

        calls = 0

        def evaluate() -> Tensor:  # the first call of a step is the start point, then line search
            nonlocal calls
            calls += 1
            return first_evaluation() if calls == 1 else closure()

        self._trials = []
        before = self._versions()
        super().step(evaluate)
        f_start, g_start = start[0]
        if not self._objectives:
            self._objectives.append(f_start)
        state = self.state[self._params[0]]
        final = None
        if self._trials:
            t = float(state["t"])
            if t == 0.0:  # the line search found no better point than the start
                final = (0.0, f_start, g_start)
                self.finished, self.reason = True, "line search failed"
            else:
                final = next((trial for trial in reversed(self._trials) if trial[0] == t), None)
        if final is None:
            if self._versions() != before:  # moved to a point not evaluated (no line search): evaluate it
                loss = float(torch.enable_grad()(closure)().detach())
                self.evaluations += 1
                final = (0.0, loss, self._gather_flat_grad())
            else:  # torch stopped before the line search: the direction is not a descent one
                final = (0.0, f_start, g_start)
                self.finished, self.reason = True, "no descent direction"
        _, f_new, g_new = final
        self._cache = (self._versions(), f_new, g_new)
        self.iterations += 1
        self._objectives.append(f_new)
        return f_new

    def _check(self, f_new: float, grad_norm: float, weight_norm: float) -> None:
        relative = self.history[-1]["relative_change"]
        if not math.isfinite(f_new):
            self.finished, self.converged, self.reason = True, False, f"objective is {f_new}"
            return
        if self.finished:  # the line search stalled: an optimum only if nothing was left to gain
            small = grad_norm / max(weight_norm, 1.0) <= max(self.tolerance_grad, 1e-8)
            before = self.history[-2]["relative_change"] if len(self.history) > 1 else math.inf
            self.converged = small or abs(before) <= self.tolerance_change
            if self.converged:
                self.reason += " at a numerical optimum"
            return
        if self.tolerance_grad > 0 and grad_norm / max(weight_norm, 1.0) <= self.tolerance_grad:
            self.converged, self.finished, self.reason = True, True, "gradient norm below tolerance"
        elif self.tolerance_change > 0 and len(self._objectives) > self.period and relative <= self.tolerance_change:
            self.converged, self.finished, self.reason = True, True, "objective change below tolerance"
        elif self.max_iterations is not None and self.iterations >= self.max_iterations:
            self.finished, self.reason = True, "iteration limit"

    def step(self, closure: Closure) -> Tensor:  # type: ignore[override]
        """Run up to ``iterations_per_step`` iterations (fewer if the run finishes); returns the
        objective at the final point."""
        f_new = float("nan")
        for _ in range(self.iterations_per_step):
            if self.finished:
                break
            evaluations = self.evaluations
            began, cpu_began = time.perf_counter(), time.process_time()
            f_new = self._iterate(closure)
            seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - cpu_began
            g_new = self._cache[2] if self._cache is not None else self._gather_flat_grad()
            grad_norm = float(g_new.double().norm())
            weight_norm = self._weight_norm()
            back = self._objectives[max(0, len(self._objectives) - 1 - self.period)]
            relative = (back - f_new) / max(abs(f_new), 1e-10)
            self.history.append(
                {
                    "iteration": float(self.iterations),
                    "objective": f_new,
                    "relative_change": relative,
                    "grad_norm": grad_norm,
                    "weight_norm": weight_norm,
                    "evaluations": float(self.evaluations - evaluations),
                    "seconds": seconds,
                    "cpu_seconds": cpu_seconds,  # this process's CPU time: robust to a busy machine
                }
            )
            self._check(f_new, grad_norm, weight_norm)
        return torch.tensor(f_new, dtype=torch.float64)

    def summary(self) -> dict[str, Any]:
        """Plain counts: iterations, evaluations, converged, reason, wall seconds per iteration
        (mean and median over all iterations), final objective, total CPU seconds."""
        seconds = sorted(record["seconds"] for record in self.history)
        return {
            "iterations": self.iterations,
            "evaluations": self.evaluations,
            "converged": self.converged,
            "reason": self.reason or "running",
            "seconds_per_iteration": sum(seconds) / len(seconds) if seconds else float("nan"),
            "median_seconds_per_iteration": seconds[len(seconds) // 2] if seconds else float("nan"),
            "objective": self.history[-1]["objective"] if self.history else float("nan"),
            "cpu_seconds": sum(record["cpu_seconds"] for record in self.history),
        }


def sigma2_to_crfsuite_c2(sigma2: float) -> float:
    """CRFsuite's L2 coefficient for a Gaussian prior of variance ``sigma2``.

    MALLET (and neurocrf) minimise ``-LL + ||w||^2 / (2 sigma^2)``; CRFsuite's L-BFGS trainer
    minimises ``-LL + c2 ||w||^2`` (train_lbfgs.c adds ``c2 * norm`` to the objective and
    ``2 c2 w`` to the gradient), both with ``-LL`` summed over the training sequences. So
    ``c2 = 1 / (2 sigma^2)``: sigma^2 = 100 (sigma = 10) is c2 = 0.005, CRFsuite's default
    c2 = 1 is sigma^2 = 0.5.
    """
    if sigma2 <= 0:
        raise ValueError(f"sigma2 must be positive, got {sigma2}")
    return 1.0 / (2.0 * float(sigma2))


def crfsuite_c2_to_sigma2(c2: float) -> float:
    """Inverse of :func:`sigma2_to_crfsuite_c2`."""
    if c2 <= 0:
        raise ValueError(f"c2 must be positive, got {c2}")
    return 1.0 / (2.0 * float(c2))
