"""Optional compiled kernel for first-order chains: the forward-backward pass and Viterbi in C.

Off by default. Turn it on with ``NEUROCRF_COMPILED_KERNEL=1`` in the environment or
:func:`use_compiled_kernel`; the first use compiles a small C file with the system C compiler
(``$CC``, ``cc``, ``gcc`` or ``clang``; about a second) into ``~/.cache/neurocrf`` (or
``$XDG_CACHE_HOME/neurocrf``) and loads it with :mod:`ctypes`: no torch headers, no build step at
install time. Without a working compiler it warns once, says why, and
:mod:`~neurocrf.structs.fast_first_order` keeps its pure-torch loops.

The kernel computes what the pure-torch path computes (and the score of given tag paths), row by row
on CPU tensors: the rescaled
forward-backward pass in float64 (rescaled at every position and certified as it runs: every
product of a nonzero rescaled value and a nonzero factor of the next step is at least
``exp(-700)``, so no finite score is lost to underflow; otherwise it reports failure and the
caller takes the general path), and Viterbi with the same sums and first-index ties as
:meth:`~neurocrf.structs.chain.Chain.viterbi`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
import warnings
from pathlib import Path

import torch
from torch import Tensor

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* exp of the smallest finite entry of the log-scores x [n] (1 if none); sets *ok = 0 if an entry
   is NaN or +inf, or the exp of the largest one overflows. */
static double exp_low(const double* x, int64_t n, int* ok) {
  double low = INFINITY, high = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (isnan(x[i]) || x[i] == INFINITY) *ok = 0;
    if (x[i] > -INFINITY) { low = fmin(low, x[i]); high = fmax(high, x[i]); }
  }
  if (high > -INFINITY && !isfinite(exp(high))) *ok = 0;
  return low < INFINITY ? exp(low) : 1.0;
}

/* Certificate, checked as the scans run: every step multiplies values rescaled to max 1 by factors
   exp(score). If every nonzero value v entering a step satisfies v >= tiny (exp(-700), a normal
   number) and v * (smallest factor of the step) >= tiny, no product of a finite score underflows
   to zero or to a subnormal and no sum overflows, so the result equals the log-space scan up to
   float64 rounding. Otherwise the function returns 0 and the caller takes the general path. */
static int entering_ok(const double* v, int64_t n, double bound) {
  for (int64_t i = 0; i < n; ++i)
    if (v[i] != 0.0 && !(v[i] >= bound)) return 0;
  return 1;
}

/* Forward pass over rows b, given em [B, T, S] (float64 emissions), probs = exp(em - shift) and
   shift [B, T] (row maxima): alphas [B, T, S] rescaled to row max 1 at every position, log Z [B].
   Returns 1 if certified and every row has a path. */
int fb_forward(int64_t B, int64_t T, int64_t S, const double* st, const double* w, const double* en,
               const double* em, const double* probs, const double* shifts, const int64_t* len, double tiny,
               double* lz, double* al) {
  double* ew = malloc(sizeof(double) * (S * S + 2 * S));
  double *ee = ew + S * S, *es = ee + S;
  int ok = 1;
  for (int64_t i = 0; i < S * S; ++i) ew[i] = exp(w[i]);
  for (int64_t i = 0; i < S; ++i) { ee[i] = exp(en[i]); es[i] = exp(st[i]); }
  const double w_low = exp_low(w, S * S, &ok), e_low = exp_low(en, S, &ok), s_low = exp_low(st, S, &ok);
  for (int64_t b = 0; b < B && ok; ++b) {
    const int64_t n = len[b];
    lz[b] = 0.0;
    if (n == 0) continue;
    double total = 0.0;
    for (int64_t t = 0; t < n && ok; ++t) {
      const int64_t at = (b * T + t) * S;
      const double *p = probs + at, shift = shifts[b * T + t];
      double* a = al + at;
      if (!isfinite(shift)) { ok = 0; break; }
      const double p_low = exp_low(em + at, S, &ok) / exp(shift);
      if (t == 0) {
        if (!(s_low * p_low >= tiny)) ok = 0;
        for (int64_t k = 0; k < S; ++k) a[k] = es[k] * p[k];
      } else {
        const double* prev = a - S;
        if (!entering_ok(prev, S, fmax(tiny, tiny / (w_low * p_low)))) ok = 0;
        for (int64_t k = 0; k < S; ++k) a[k] = 0.0;
        for (int64_t j = 0; j < S; ++j) {
          const double aj = prev[j];
          if (aj == 0.0) continue;
          const double* row = ew + j * S;
          for (int64_t k = 0; k < S; ++k) a[k] += aj * row[k];
        }
        for (int64_t k = 0; k < S; ++k) a[k] *= p[k];
      }
      double peak = 0.0;
      for (int64_t k = 0; k < S; ++k) peak = fmax(peak, a[k]);
      if (!(peak > 0.0) || !isfinite(peak)) { ok = 0; break; }
      const double inverse = 1.0 / peak;
      for (int64_t k = 0; k < S; ++k) a[k] *= inverse;
      total += log(peak) + shift;
    }
    if (!ok) break;
    const double* last = al + (b * T + n - 1) * S;
    if (!entering_ok(last, S, fmax(tiny, tiny / e_low))) { ok = 0; break; }
    double z = 0.0;
    for (int64_t k = 0; k < S; ++k) z += last[k] * ee[k];
    if (!(z > 0.0) || !isfinite(z)) { ok = 0; break; }
    lz[b] = log(z) + total;
  }
  free(ew);
  return ok;
}

/* Backward pass: gradients of sum_b g[b] log Z[b] added into gs [S], gw [S, S], ge [S], gm [B, T, S]
   (zero-initialised by the caller), with alphas from fb_forward. The normalisers of node and edge
   marginals must exceed `floor`: terms lost to underflow are then below exp(-708) / floor of them.
   Returns 1 if certified. */
int fb_backward(int64_t B, int64_t T, int64_t S, const double* w, const double* en, const double* em,
                const double* probs, const double* shifts, const int64_t* len, const double* al,
                const double* g, double tiny, double floor, double* gs, double* gw, double* ge, double* gm) {
  double* ew = malloc(sizeof(double) * (S * S + 3 * S));
  double *beta = ew + S * S, *raw = beta + S, *q = raw + S;
  int ok = 1;
  for (int64_t i = 0; i < S * S; ++i) ew[i] = exp(w[i]);
  const double w_low = exp_low(w, S * S, &ok);
  for (int64_t b = 0; b < B && ok; ++b) {
    const int64_t n = len[b];
    if (n == 0) continue;
    const double gb = g[b];
    double peak = 0.0;
    for (int64_t k = 0; k < S; ++k) { beta[k] = exp(en[k]); peak = fmax(peak, beta[k]); }
    if (!(peak > 0.0) || !isfinite(peak)) { ok = 0; break; }
    for (int64_t k = 0; k < S; ++k) beta[k] /= peak;
    if (!entering_ok(beta, S, tiny)) { ok = 0; break; }
    for (int64_t t = n - 1; t >= 0; --t) {
      const int64_t at = (b * T + t) * S;
      const double* a = al + at;
      double* m = gm + at;
      double d = 0.0;
      for (int64_t k = 0; k < S; ++k) d += a[k] * beta[k];
      if (!(d > floor) || !isfinite(d)) { ok = 0; break; }
      const double scale = gb / d;
      for (int64_t k = 0; k < S; ++k) m[k] = a[k] * beta[k] * scale;
      if (t == n - 1) for (int64_t k = 0; k < S; ++k) ge[k] += m[k];
      if (t == 0) { for (int64_t k = 0; k < S; ++k) gs[k] += m[k]; break; }
      /* q = probs_t * beta_t; raw = expW q is beta_{t-1} before rescaling; edges / sum(alpha_{t-1} raw) */
      const double* p = probs + at;
      const double p_low = exp_low(em + at, S, &ok) / exp(shifts[b * T + t]);
      if (!entering_ok(beta, S, fmax(tiny, tiny / (w_low * p_low)))) ok = 0;
      for (int64_t k = 0; k < S; ++k) q[k] = p[k] * beta[k];
      const double* prev = a - S;
      double dp = 0.0;
      for (int64_t j = 0; j < S; ++j) {
        const double* row = ew + j * S;
        double s = 0.0;
        for (int64_t k = 0; k < S; ++k) s += row[k] * q[k];
        raw[j] = s;
        dp += prev[j] * s;
      }
      if (!(dp > floor) || !isfinite(dp)) { ok = 0; break; }
      const double edge_scale = gb / dp;
      for (int64_t j = 0; j < S; ++j) {
        const double aj = prev[j] * edge_scale;
        if (aj == 0.0) continue;
        const double* row = ew + j * S;
        double* out = gw + j * S;
        for (int64_t k = 0; k < S; ++k) out[k] += aj * row[k] * q[k];
      }
      peak = 0.0;
      for (int64_t j = 0; j < S; ++j) peak = fmax(peak, raw[j]);
      if (!(peak > 0.0) || !isfinite(peak)) { ok = 0; break; }
      const double inverse = 1.0 / peak;
      for (int64_t j = 0; j < S; ++j) beta[j] = raw[j] * inverse;
    }
  }
  free(ew);
  return ok;
}

/* Viterbi: states [B, T] (-1 past each length and in rows without a path), best scores [B]. The sums
   are those of the torch scan, score[j] + (w[j, k] + e[t, k]), and ties go to the first index. */
#define VITERBI(NAME, REAL)                                                                        \
void NAME(int64_t B, int64_t T, int64_t S, const REAL* st, const REAL* w, const REAL* en,          \
          const REAL* e, const int64_t* len, int64_t* out, REAL* best) {                           \
  REAL* score = malloc(sizeof(REAL) * 2 * S);                                                      \
  REAL* next = score + S;                                                                          \
  int64_t* back = malloc(sizeof(int64_t) * (T > 0 ? T : 1) * S);                                   \
  for (int64_t b = 0; b < B; ++b) {                                                                \
    const int64_t n = len[b];                                                                      \
    int64_t* path = out + b * T;                                                                   \
    for (int64_t t = 0; t < T; ++t) path[t] = -1;                                                  \
    best[b] = 0;                                                                                   \
    if (n == 0) continue;                                                                          \
    const REAL* eb = e + b * T * S;                                                                \
    for (int64_t k = 0; k < S; ++k) score[k] = st[k] + eb[k];                                      \
    for (int64_t t = 1; t < n; ++t) {                                                              \
      for (int64_t k = 0; k < S; ++k) {                                                            \
        REAL top = score[0] + (w[k] + eb[t * S + k]);                                              \
        int64_t arg = 0;                                                                           \
        for (int64_t j = 1; j < S; ++j) {                                                          \
          const REAL v = score[j] + (w[j * S + k] + eb[t * S + k]);                                \
          if (v > top) { top = v; arg = j; }                                                       \
        }                                                                                          \
        next[k] = top;                                                                             \
        back[t * S + k] = arg;                                                                     \
      }                                                                                            \
      memcpy(score, next, sizeof(REAL) * S);                                                       \
    }                                                                                              \
    REAL top = score[0] + (en[0] + (REAL)0);                                                       \
    int64_t arg = 0;                                                                               \
    for (int64_t k = 1; k < S; ++k) {                                                              \
      const REAL v = score[k] + (en[k] + (REAL)0);                                                 \
      if (v > top) { top = v; arg = k; }                                                           \
    }                                                                                              \
    best[b] = top;                                                                                 \
    if (!(top > -INFINITY)) continue;                                                              \
    path[n - 1] = arg;                                                                             \
    for (int64_t t = n - 1; t > 0; --t) path[t - 1] = back[t * S + path[t]];                       \
  }                                                                                                \
  free(score);                                                                                     \
  free(back);                                                                                      \
}
VITERBI(viterbi_f32, float)
VITERBI(viterbi_f64, double)

/* Score of the tag paths y [B, T] (entries past each length ignored; returns 0 if an entry before
   is outside [0, S)), and its gradient: g[b] added at every score the path of row b uses (outputs
   zero-initialised by the caller). */
#define GOLD(NAME, BACKWARD, REAL)                                                                 \
int NAME(int64_t B, int64_t T, int64_t S, const REAL* st, const REAL* w, const REAL* en,           \
         const REAL* e, const int64_t* y, const int64_t* len, REAL* out) {                         \
  for (int64_t b = 0; b < B; ++b) {                                                                \
    const int64_t n = len[b];                                                                      \
    const int64_t* yb = y + b * T;                                                                 \
    const REAL* eb = e + b * T * S;                                                                \
    REAL total = 0;                                                                                \
    for (int64_t t = 0; t < n; ++t) if (yb[t] < 0 || yb[t] >= S) return 0;                         \
    if (n > 0) {                                                                                   \
      for (int64_t t = 0; t < n; ++t) total += eb[t * S + yb[t]];                                  \
      for (int64_t t = 1; t < n; ++t) total += w[yb[t - 1] * S + yb[t]];                           \
      total += st[yb[0]] + en[yb[n - 1]];                                                          \
    }                                                                                              \
    out[b] = total;                                                                                \
  }                                                                                                \
  return 1;                                                                                        \
}                                                                                                  \
void BACKWARD(int64_t B, int64_t T, int64_t S, const int64_t* y, const int64_t* len, const REAL* g, \
              REAL* gs, REAL* gw, REAL* ge, REAL* gm) {                                            \
  for (int64_t b = 0; b < B; ++b) {                                                                \
    const int64_t n = len[b];                                                                      \
    if (n == 0) continue;                                                                          \
    const int64_t* yb = y + b * T;                                                                 \
    for (int64_t t = 0; t < n; ++t) gm[(b * T + t) * S + yb[t]] += g[b];                           \
    for (int64_t t = 1; t < n; ++t) gw[yb[t - 1] * S + yb[t]] += g[b];                             \
    gs[yb[0]] += g[b];                                                                             \
    ge[yb[n - 1]] += g[b];                                                                         \
  }                                                                                                \
}
GOLD(gold_f32, gold_backward_f32, float)
GOLD(gold_f64, gold_backward_f64, double)
"""

_ENV = "NEUROCRF_COMPILED_KERNEL"
_enabled = os.environ.get(_ENV, "").lower() in {"1", "true", "yes", "on"}
_library: ctypes.CDLL | None = None
_failed: str | None = None
_I64, _F64, _PTR = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p


def use_compiled_kernel(enabled: bool = True) -> bool:
    """Turn the compiled kernel on or off; returns whether it is now in use (builds it on first use,
    warns once and stays on the pure-torch path if it cannot be built)."""
    global _enabled
    _enabled = enabled
    return enabled and _load() is not None


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "neurocrf"


def _build(target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC or install gcc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        source, library = Path(tmp) / "kernel.c", Path(tmp) / target.name
        source.write_text(_SOURCE)
        run = subprocess.run([compiler, "-O3", "-shared", "-fPIC", "-std=c99", str(source), "-o", str(library), "-lm"],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {run.stderr.strip()[-500:]}")
        os.replace(library, target)  # atomic: concurrent builders never see a partial file


def _load() -> ctypes.CDLL | None:
    """The compiled library if enabled and buildable, else None (one warning on failure)."""
    global _library, _failed
    if not _enabled or _failed is not None:
        return None
    if _library is None:
        digest = hashlib.sha256(_SOURCE.encode()).hexdigest()[:16]
        target = _cache_dir() / f"first_order_kernel_{digest}{sysconfig.get_config_var('SHLIB_SUFFIX') or '.so'}"
        try:
            if not target.exists():
                _build(target)
            library = ctypes.CDLL(str(target))
        except Exception as error:  # no compiler, a failed build, an unloadable library
            _failed = f"{type(error).__name__}: {error}"
            warnings.warn(f"neurocrf's compiled CRF kernel is unavailable ({_failed}); using the pure-torch path",
                          RuntimeWarning, stacklevel=3)
            return None
        library.fb_forward.restype = ctypes.c_int
        library.fb_forward.argtypes = [_I64] * 3 + [_PTR] * 7 + [_F64] + [_PTR] * 2
        library.fb_backward.restype = ctypes.c_int
        library.fb_backward.argtypes = [_I64] * 3 + [_PTR] * 8 + [_F64] * 2 + [_PTR] * 4
        for name in ("viterbi_f32", "viterbi_f64", "gold_f32", "gold_f64"):
            getattr(library, name).restype = ctypes.c_int if name.startswith("gold") else None
            getattr(library, name).argtypes = [_I64] * 3 + [_PTR] * 7
        for name in ("gold_backward_f32", "gold_backward_f64"):
            getattr(library, name).restype = None
            getattr(library, name).argtypes = [_I64] * 3 + [_PTR] * 7
        _library = library
    return _library


def available(*tensors: Tensor) -> bool:
    """Whether the kernel is on, built, and every tensor is on the CPU."""
    return _enabled and all(t.device.type == "cpu" for t in tensors) and _load() is not None


def fb_forward(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, probs: Tensor, shift: Tensor,
               lengths: Tensor, tiny: float) -> tuple[Tensor, Tensor, bool]:
    """float64 contiguous CPU inputs (``emissions`` and ``probs = exp(emissions - shift)`` ``[B, T, S]``,
    ``shift`` ``[B, T]`` the row maxima, int64 ``lengths``) -> log Z ``[B]``, rescaled alphas
    ``[B, T, S]``, certified."""
    batch, steps, size = probs.shape
    log_z = probs.new_empty(batch)
    alphas = probs.new_empty(batch, steps, size)
    ok = _library.fb_forward(batch, steps, size, start.data_ptr(), transitions.data_ptr(), end.data_ptr(),
                             emissions.data_ptr(), probs.data_ptr(), shift.data_ptr(), lengths.data_ptr(), tiny,
                             log_z.data_ptr(), alphas.data_ptr())
    return log_z, alphas, bool(ok)


def fb_backward(transitions: Tensor, end: Tensor, emissions: Tensor, probs: Tensor, shift: Tensor, lengths: Tensor,
                alphas: Tensor, grad: Tensor, tiny: float, floor: float) -> tuple[Tensor, Tensor, Tensor, Tensor, bool]:
    """Gradients of ``sum_b grad[b] log Z[b]``: start, transitions, end, emissions (float64), certified."""
    batch, steps, size = probs.shape
    grads = torch.zeros(size * (size + 2) + batch * steps * size, dtype=torch.float64)
    g_start, g_moves, g_end, g_em = grads.split([size, size * size, size, batch * steps * size])
    ok = _library.fb_backward(batch, steps, size, transitions.data_ptr(), end.data_ptr(), emissions.data_ptr(),
                              probs.data_ptr(), shift.data_ptr(), lengths.data_ptr(), alphas.data_ptr(),
                              grad.data_ptr(), tiny, floor, g_start.data_ptr(), g_moves.data_ptr(), g_end.data_ptr(),
                              g_em.data_ptr())
    return g_start, g_moves.view(size, size), g_end, g_em.view(batch, steps, size), bool(ok)


def _typed(name: str, dtype: torch.dtype):
    if dtype == torch.float64:
        return getattr(_library, f"{name}_f64")
    if dtype == torch.float32:
        return getattr(_library, f"{name}_f32")
    raise ValueError(f"the compiled kernel takes float32 or float64, got {dtype}")


def gold_score(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, states: Tensor, lengths: Tensor
               ) -> Tensor:
    """Contiguous CPU inputs of one float dtype, int64 ``states [B, T]`` and ``lengths`` -> ``[B]``
    scores of the paths."""
    batch, steps, size = emissions.shape
    out = emissions.new_empty(batch)
    ok = _typed("gold", emissions.dtype)(batch, steps, size, start.data_ptr(), transitions.data_ptr(), end.data_ptr(),
                                         emissions.data_ptr(), states.data_ptr(), lengths.data_ptr(), out.data_ptr())
    if not ok:
        raise IndexError(f"a state id outside [0, {size}) inside a row's length")
    return out


def gold_backward(states: Tensor, lengths: Tensor, grad: Tensor, size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of ``sum_b grad[b] * score[b]``: start ``[S]``, transitions ``[S, S]``, end ``[S]``,
    emissions ``[B, T, S]`` in ``grad``'s dtype."""
    batch, steps = states.shape
    grads = grad.new_zeros(size * (size + 2) + batch * steps * size)
    g_start, g_moves, g_end, g_em = grads.split([size, size * size, size, batch * steps * size])
    _typed("gold_backward", grad.dtype)(batch, steps, size, states.data_ptr(), lengths.data_ptr(), grad.data_ptr(),
                                        g_start.data_ptr(), g_moves.data_ptr(), g_end.data_ptr(), g_em.data_ptr())
    return g_start, g_moves.view(size, size), g_end, g_em.view(batch, steps, size)


def viterbi(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor
            ) -> tuple[Tensor, Tensor]:
    """Contiguous CPU inputs (float32 or float64, int64 ``lengths``) -> states ``[B, T]`` (-1 past
    each length and in rows without a path), best scores ``[B]``."""
    batch, steps, size = emissions.shape
    function = _typed("viterbi", emissions.dtype)
    states = torch.empty(batch, steps, dtype=torch.long)
    best = emissions.new_empty(batch)
    function(batch, steps, size, start.data_ptr(), transitions.data_ptr(), end.data_ptr(), emissions.data_ptr(),
             lengths.data_ptr(), states.data_ptr(), best.data_ptr())
    return states, best
