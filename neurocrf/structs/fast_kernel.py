"""Optional compiled kernel for first-order chains: the forward-backward pass and Viterbi in C++.

Off by default. Turn it on with ``NEUROCRF_COMPILED_KERNEL=1`` in the environment or
:func:`use_compiled_kernel`; the first use compiles it with ``torch.utils.cpp_extension`` (about a
minute; cached afterwards in torch's extension directory). Without a working C++ compiler it warns
once, says why, and :mod:`~neurocrf.structs.fast_first_order` keeps its pure-torch loops.

The kernel computes what the pure-torch path computes, row by row on CPU tensors: the rescaled
forward-backward pass in float64 (rescaled at every position, certified by the same rule as
:class:`~neurocrf.structs.chain._ExpScan`: every nonzero rescaled value above
``exp(-(700 - step_spread))``, so no finite score is lost to underflow; otherwise it reports failure
and the caller takes the log-space path), and Viterbi with the same sums and first-index ties as
:meth:`~neurocrf.structs.chain.Chain.viterbi`.
"""

from __future__ import annotations

import os
import warnings
from types import ModuleType

import torch

_SOURCE = r"""
#include <torch/extension.h>
#include <cmath>
#include <limits>
#include <vector>

// Forward pass. Returns log Z [B], alphas [B, T, S] rescaled to row max 1, ok.
std::tuple<torch::Tensor, torch::Tensor, bool> fb_forward(
    torch::Tensor start, torch::Tensor trans, torch::Tensor end, torch::Tensor em, torch::Tensor lengths,
    double danger) {
  const int64_t B = em.size(0), T = em.size(1), S = em.size(2);
  auto opts = em.options();
  auto log_z = torch::zeros({B}, opts);
  auto alphas = torch::zeros({B, T, S}, opts);
  const double* st = start.data_ptr<double>();
  const double* w = trans.data_ptr<double>();
  const double* en = end.data_ptr<double>();
  const double* e = em.data_ptr<double>();
  const int64_t* len = lengths.data_ptr<int64_t>();
  double* lz = log_z.data_ptr<double>();
  double* al = alphas.data_ptr<double>();
  std::vector<double> ew(S * S), ee(S), es(S), p(S);
  for (int64_t i = 0; i < S * S; ++i) ew[i] = std::exp(w[i]);
  for (int64_t i = 0; i < S; ++i) { ee[i] = std::exp(en[i]); es[i] = std::exp(st[i]); }
  bool ok = true;
  for (int64_t b = 0; b < B && ok; ++b) {
    const int64_t n = len[b];
    if (n == 0) continue;
    double total = 0.0;
    for (int64_t t = 0; t < n && ok; ++t) {
      const double* et = e + (b * T + t) * S;
      double* a = al + (b * T + t) * S;
      double shift = -std::numeric_limits<double>::infinity();
      for (int64_t k = 0; k < S; ++k) shift = std::max(shift, et[k]);
      if (!std::isfinite(shift)) { ok = false; break; }
      for (int64_t k = 0; k < S; ++k) p[k] = std::exp(et[k] - shift);
      if (t == 0) {
        for (int64_t k = 0; k < S; ++k) a[k] = es[k] * p[k];
      } else {
        const double* prev = a - S;
        for (int64_t k = 0; k < S; ++k) a[k] = 0.0;
        for (int64_t j = 0; j < S; ++j) {
          const double aj = prev[j];
          if (aj == 0.0) continue;
          const double* row = ew.data() + j * S;
          for (int64_t k = 0; k < S; ++k) a[k] += aj * row[k];
        }
        for (int64_t k = 0; k < S; ++k) a[k] *= p[k];
      }
      double peak = 0.0;
      for (int64_t k = 0; k < S; ++k) peak = std::max(peak, a[k]);
      if (!(peak > 0.0) || !std::isfinite(peak)) { ok = false; break; }
      for (int64_t k = 0; k < S; ++k) {
        a[k] /= peak;
        if (a[k] != 0.0 && !(a[k] > danger)) ok = false;
      }
      total += std::log(peak) + shift;
    }
    if (!ok) break;
    const double* last = al + (b * T + n - 1) * S;
    double z = 0.0;
    for (int64_t k = 0; k < S; ++k) z += last[k] * ee[k];
    if (!(z > 0.0) || !std::isfinite(z)) { ok = false; break; }
    lz[b] = std::log(z) + total;
  }
  return {log_z, alphas, ok};
}

// Backward pass: gradients of sum_b g[b] log Z[b]. Returns grad start, trans, end, emissions, ok.
// The normalisers of node and edge marginals must exceed `floor`: terms lost to underflow are then
// below exp(-708) / floor of them.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor, bool> fb_backward(
    torch::Tensor trans, torch::Tensor end, torch::Tensor em, torch::Tensor lengths, torch::Tensor alphas,
    torch::Tensor grad, double danger, double floor) {
  const int64_t B = em.size(0), T = em.size(1), S = em.size(2);
  auto opts = em.options();
  auto g_start = torch::zeros({S}, opts), g_end = torch::zeros({S}, opts);
  auto g_trans = torch::zeros({S, S}, opts), g_em = torch::zeros({B, T, S}, opts);
  const double* w = trans.data_ptr<double>();
  const double* en = end.data_ptr<double>();
  const double* e = em.data_ptr<double>();
  const int64_t* len = lengths.data_ptr<int64_t>();
  const double* al = alphas.data_ptr<double>();
  const double* g = grad.data_ptr<double>();
  double* gs = g_start.data_ptr<double>();
  double* ge = g_end.data_ptr<double>();
  double* gw = g_trans.data_ptr<double>();
  double* gm = g_em.data_ptr<double>();
  std::vector<double> ew(S * S), beta(S), raw(S), q(S);
  for (int64_t i = 0; i < S * S; ++i) ew[i] = std::exp(w[i]);
  bool ok = true;
  for (int64_t b = 0; b < B && ok; ++b) {
    const int64_t n = len[b];
    if (n == 0) continue;
    const double gb = g[b];
    double peak = 0.0;
    for (int64_t k = 0; k < S; ++k) { beta[k] = std::exp(en[k]); peak = std::max(peak, beta[k]); }
    for (int64_t k = 0; k < S; ++k) beta[k] /= peak;
    for (int64_t t = n - 1; t >= 0; --t) {
      const double* a = al + (b * T + t) * S;
      double* m = gm + (b * T + t) * S;
      double d = 0.0;
      for (int64_t k = 0; k < S; ++k) d += a[k] * beta[k];
      if (!(d > floor) || !std::isfinite(d)) { ok = false; break; }
      const double scale = gb / d;
      for (int64_t k = 0; k < S; ++k) m[k] = a[k] * beta[k] * scale;
      if (t == n - 1) for (int64_t k = 0; k < S; ++k) ge[k] += m[k];
      if (t == 0) { for (int64_t k = 0; k < S; ++k) gs[k] += m[k]; break; }
      // q = probs_t * beta_t; raw = expW q (beta_{t-1} before rescaling); edges / sum(alpha_{t-1} raw)
      const double* et = e + (b * T + t) * S;
      double shift = -std::numeric_limits<double>::infinity();
      for (int64_t k = 0; k < S; ++k) shift = std::max(shift, et[k]);
      for (int64_t k = 0; k < S; ++k) q[k] = std::exp(et[k] - shift) * beta[k];
      const double* prev = a - S;
      double dp = 0.0;
      for (int64_t j = 0; j < S; ++j) {
        const double* row = ew.data() + j * S;
        double s = 0.0;
        for (int64_t k = 0; k < S; ++k) s += row[k] * q[k];
        raw[j] = s;
        dp += prev[j] * s;
      }
      if (!(dp > floor) || !std::isfinite(dp)) { ok = false; break; }
      const double edge_scale = gb / dp;
      for (int64_t j = 0; j < S; ++j) {
        const double aj = prev[j] * edge_scale;
        if (aj == 0.0) continue;
        const double* row = ew.data() + j * S;
        double* out = gw + j * S;
        for (int64_t k = 0; k < S; ++k) out[k] += aj * row[k] * q[k];
      }
      peak = 0.0;
      for (int64_t j = 0; j < S; ++j) peak = std::max(peak, raw[j]);
      if (!(peak > 0.0) || !std::isfinite(peak)) { ok = false; break; }
      for (int64_t j = 0; j < S; ++j) {
        beta[j] = raw[j] / peak;
        if (beta[j] != 0.0 && !(beta[j] > danger)) ok = false;
      }
    }
  }
  return {g_start, g_trans, g_end, g_em, ok};
}

// Viterbi: states [B, T] (-1 past each length and in rows without a path), best scores [B].
template <typename scalar_t>
void viterbi_rows(const scalar_t* st, const scalar_t* w, const scalar_t* en, const scalar_t* e, const int64_t* len,
                  int64_t B, int64_t T, int64_t S, int64_t* out, scalar_t* best) {
  std::vector<scalar_t> score(S), next(S);
  std::vector<int64_t> back(T * S);
  const scalar_t neg = -std::numeric_limits<scalar_t>::infinity();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = len[b];
    int64_t* path = out + b * T;
    for (int64_t t = 0; t < T; ++t) path[t] = -1;
    if (n == 0) { best[b] = 0; continue; }
    const scalar_t* eb = e + b * T * S;
    for (int64_t k = 0; k < S; ++k) score[k] = st[k] + eb[k];
    for (int64_t t = 1; t < n; ++t) {
      for (int64_t k = 0; k < S; ++k) {
        scalar_t top = neg;
        int64_t arg = 0;
        bool first = true;
        for (int64_t j = 0; j < S; ++j) {
          const scalar_t v = score[j] + (w[j * S + k] + eb[t * S + k]);
          if (first || v > top) { top = v; arg = j; first = false; }
        }
        next[k] = top;
        back[t * S + k] = arg;
      }
      std::swap(score, next);
    }
    scalar_t top = neg;
    int64_t arg = 0;
    for (int64_t k = 0; k < S; ++k) {
      const scalar_t v = score[k] + (en[k] + scalar_t(0));
      if (k == 0 || v > top) { top = v; arg = k; }
    }
    best[b] = top;
    if (!(top > neg)) continue;
    path[n - 1] = arg;
    for (int64_t t = n - 1; t > 0; --t) path[t - 1] = back[t * S + path[t]];
  }
}

std::tuple<torch::Tensor, torch::Tensor> viterbi(torch::Tensor start, torch::Tensor trans, torch::Tensor end,
                                                 torch::Tensor em, torch::Tensor lengths) {
  const int64_t B = em.size(0), T = em.size(1), S = em.size(2);
  auto states = torch::empty({B, T}, lengths.options());
  auto best = torch::empty({B}, em.options());
  AT_DISPATCH_FLOATING_TYPES(em.scalar_type(), "viterbi", [&] {
    viterbi_rows<scalar_t>(start.data_ptr<scalar_t>(), trans.data_ptr<scalar_t>(), end.data_ptr<scalar_t>(),
                           em.data_ptr<scalar_t>(), lengths.data_ptr<int64_t>(), B, T, S,
                           states.data_ptr<int64_t>(), best.data_ptr<scalar_t>());
  });
  return {states, best};
}
"""

_ENV = "NEUROCRF_COMPILED_KERNEL"
_enabled = os.environ.get(_ENV, "").lower() in {"1", "true", "yes", "on"}
_module: ModuleType | None = None
_failed: str | None = None


def use_compiled_kernel(enabled: bool = True) -> bool:
    """Turn the compiled kernel on or off; returns whether it is now in use (compiles on first use,
    warns and stays off if it cannot be built)."""
    global _enabled
    _enabled = enabled
    return enabled and load() is not None


def load() -> ModuleType | None:
    """The compiled module if enabled and buildable, else None (one warning on failure)."""
    global _module, _failed
    if not _enabled or _failed is not None:
        return None
    if _module is None:
        try:
            from torch.utils.cpp_extension import load_inline

            _module = load_inline(name="neurocrf_first_order_kernel", cpp_sources=[_SOURCE],
                                  functions=["fb_forward", "fb_backward", "viterbi"],
                                  extra_cflags=["-O3"], verbose=False)
        except Exception as error:  # no compiler, no headers, a failed build: keep the torch path
            _failed = f"{type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error).strip() else ''}"
            warnings.warn(f"neurocrf's compiled CRF kernel could not be built ({_failed}); "
                          "using the pure-torch path", RuntimeWarning, stacklevel=2)
            return None
    return _module


def usable(*tensors: torch.Tensor) -> ModuleType | None:
    """The compiled module when it is on and every tensor is on the CPU, else None."""
    if not _enabled:
        return None
    if any(t.device.type != "cpu" for t in tensors):
        return None
    return load()
