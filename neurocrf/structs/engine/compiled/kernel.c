/* neurocrf's compiled CPU kernel for first-order chains; see kernel.py for the contract. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* fmax and fmin without a call into libm (which gcc emits for them without -ffast-math): as
   fmax(a, b) and fmin(a, b) for a number a and any b (NaN b gives a). */
static inline double larger(double a, double b) { return b > a ? b : a; }
static inline double smaller(double a, double b) { return b < a ? b : a; }

/* exp of the smallest finite entry of the log-scores x [n] (1 if none); sets *ok = 0 if an entry
   is NaN or +inf, or the exp of the largest one overflows. */
static double exp_low(const double* x, int64_t n, int* ok) {
  double low = INFINITY, high = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (isnan(x[i]) || x[i] == INFINITY) *ok = 0;
    if (x[i] > -INFINITY) { low = smaller(low, x[i]); high = larger(high, x[i]); }
  }
  if (high > -INFINITY && !isfinite(exp(high))) *ok = 0;
  return low < INFINITY ? exp(low) : 1.0;
}

/* The smallest factor exp(x - shift) = p of the finite scores x [n] (1 if none), read off p itself;
   sets *ok = 0 if a score is NaN or +inf. */
static double prob_low(const double* p, const double* x, int64_t n, int* ok) {
  double low = INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (isnan(x[i]) || x[i] == INFINITY) *ok = 0;
    if (x[i] > -INFINITY) low = smaller(low, p[i]);
  }
  return low < INFINITY ? low : 1.0;
}

/* Certificate, checked as the scans run: every step multiplies values rescaled to max 1 by factors
   exp(score). If every nonzero value v entering a step satisfies v >= tiny (exp(-700), a normal
   number) and v * (smallest factor of the step) >= tiny, no product of a finite score underflows
   to zero or to a subnormal and no sum overflows, so the result equals the log-space scan up to
   float64 rounding. Otherwise the function returns 0 and the caller takes the general path. */
static int entering_ok(const double* v, int64_t n, double bound) {
  for (int64_t i = 0; i < n; ++i)
    if (!(v[i] <= 0.0) && !(v[i] >= bound)) return 0;  /* also NaN */
  return 1;
}

/* The forward scan's version of the certificate: a positive value below `bound` is dropped from the
   scan instead (stored negated, so that the backward pass can bound what it carried; a state such
   as the precursor CRF's "no entity yet" O, which only its own self-loop enters, shrinks like this
   on every long sentence). Sets *dropped; returns 0 for NaN. */
static int drop_small(double* v, int64_t n, double bound, int* dropped) {
  for (int64_t i = 0; i < n; ++i) {
    if (isnan(v[i])) return 0;
    if (v[i] > 0.0 && v[i] < bound) { v[i] = -v[i]; *dropped = 1; }
  }
  return 1;
}

/* The allowed moves of exp(w) [S, S] (entries 0 for -inf scores), split for the backward scan's
   two loops over them: the destinations that every source enters (`dense` of them, listed in
   `cols`, their exp(w) row by row in `rows` [S, dense]) run as vectorised loops over compact rows;
   the other nonzero entries (j, k, value), in order of j, one by one. When that saves nothing (a
   listed move costs about two dense ones) every destination is dense and `identity` is set. The
   precursor CRF's O states and constrained I- tags, each entered from a few sources, go to the
   list; a chain with few forbidden moves stays dense. (In the forward scan's one loop per step
   the list was slower than dense rows of zeros, measured at 13 states.) */
typedef struct {
  int64_t dense, identity, count;
  int64_t *cols, *from, *to;
  double *rows, *value;
} Moves;

static void moves_free(Moves* m) {
  free(m->cols);
  free(m->rows);
}

static void moves_init(Moves* m, const double* ew, int64_t S) {
  m->cols = malloc(sizeof(int64_t) * (2 * S * S + 2 * S + 1));
  int64_t* in_dense = m->cols + S;
  m->from = in_dense + S;
  m->to = m->from + S * S;
  m->rows = malloc(sizeof(double) * (2 * S * S + 1));
  m->value = m->rows + S * S;
  int64_t nonzero = 0;
  m->dense = 0;
  for (int64_t k = 0; k < S; ++k) {
    int all = 1;
    for (int64_t j = 0; j < S; ++j) {
      all = all && ew[j * S + k] != 0.0;
      nonzero += ew[j * S + k] != 0.0;
    }
    if (all) m->cols[m->dense++] = k;
  }
  m->identity = S * m->dense + 2 * (nonzero - S * m->dense) >= S * S;
  if (m->identity) {
    m->dense = S;
    for (int64_t k = 0; k < S; ++k) m->cols[k] = k;
  }
  for (int64_t k = 0; k < S; ++k) in_dense[k] = 0;
  for (int64_t i = 0; i < m->dense; ++i) in_dense[m->cols[i]] = 1;
  for (int64_t j = 0; j < S; ++j)
    for (int64_t i = 0; i < m->dense; ++i) m->rows[j * m->dense + i] = ew[j * S + m->cols[i]];
  m->count = 0;
  for (int64_t j = 0; j < S; ++j)
    for (int64_t k = 0; k < S; ++k)
      if (!in_dense[k] && ew[j * S + k] != 0.0) {
        m->from[m->count] = j;
        m->to[m->count] = k;
        m->value[m->count++] = ew[j * S + k];
      }
}

/* The factors of the S states at one position: the C emission columns p themselves, or, with a
   column map col [S] (states sharing a column), gathered into buf [S]. */
static const double* state_factors(const double* p, const int64_t* col, int64_t S, double* buf) {
  if (!col) return p;
  for (int64_t k = 0; k < S; ++k) buf[k] = p[col[k]];
  return buf;
}

/* Forward pass over rows b, given em [B, T, C] (float64 emission columns), probs = exp(em - shift)
   and shift [B, T] (row maxima), state k scoring column col[k] (col NULL: C = S, the identity):
   alphas [B, T, S] rescaled to row max 1 at every position (values dropped by drop_small negated),
   log Z [B]. Returns 0 if not certified or a row has no path, else 1, or 2 if values were dropped:
   then only fb_backward's error bound certifies log Z. */
int fb_forward(int64_t B, int64_t T, int64_t S, int64_t C, const int64_t* col, const double* st, const double* w,
               const double* en, const double* em, const double* probs, const double* shifts, const int64_t* len,
               double tiny, double* lz, double* al) {
  double* ew = malloc(sizeof(double) * (S * S + 3 * S));
  double *ee = ew + S * S, *es = ee + S, *factors = es + S;
  int ok = 1, dropped = 0;
  for (int64_t i = 0; i < S * S; ++i) ew[i] = exp(w[i]);
  for (int64_t i = 0; i < S; ++i) { ee[i] = exp(en[i]); es[i] = exp(st[i]); }
  const double w_low = exp_low(w, S * S, &ok), e_low = exp_low(en, S, &ok), s_low = exp_low(st, S, &ok);
  for (int64_t b = 0; b < B && ok; ++b) {
    const int64_t n = len[b];
    lz[b] = 0.0;
    if (n == 0) continue;
    double total = 0.0;
    for (int64_t t = 0; t < n && ok; ++t) {
      const int64_t at = (b * T + t) * S, column = (b * T + t) * C;
      const double shift = shifts[b * T + t];
      const double* p = state_factors(probs + column, col, S, factors);
      double* a = al + at;
      if (!isfinite(shift)) { ok = 0; break; }
      const double p_low = prob_low(probs + column, em + column, C, &ok);
      if (t == 0) {
        if (!(s_low * p_low >= tiny)) ok = 0;
        for (int64_t k = 0; k < S; ++k) a[k] = es[k] * p[k];
      } else {
        double* prev = a - S;
        if (!drop_small(prev, S, larger(tiny, tiny / (w_low * p_low)), &dropped)) ok = 0;
        for (int64_t k = 0; k < S; ++k) a[k] = 0.0;
        for (int64_t j = 0; j < S; ++j) {  /* dense: a list of the allowed moves is slower here (measured) */
          const double aj = prev[j];
          if (aj <= 0.0) continue;
          const double* row = ew + j * S;
          for (int64_t k = 0; k < S; ++k) a[k] += aj * row[k];
        }
        for (int64_t k = 0; k < S; ++k) a[k] *= p[k];
      }
      double peak = 0.0;
      for (int64_t k = 0; k < S; ++k) peak = larger(peak, a[k]);
      if (!(peak > 0.0) || !isfinite(peak)) { ok = 0; break; }
      const double inverse = 1.0 / peak;
      for (int64_t k = 0; k < S; ++k) a[k] *= inverse;
      total += log(peak) + shift;
    }
    if (!ok) break;
    double* last = al + (b * T + n - 1) * S;
    if (!drop_small(last, S, larger(tiny, tiny / e_low), &dropped)) { ok = 0; break; }
    double z = 0.0;
    for (int64_t k = 0; k < S; ++k) z += larger(0.0, last[k]) * ee[k];
    if (!(z > 0.0) || !isfinite(z)) { ok = 0; break; }
    lz[b] = log(z) + total;
  }
  free(ew);
  return ok ? 1 + dropped : 0;
}

/* Backward pass (inputs as fb_forward's): node marginals gm [B, T, S] and edge marginals summed
   over the positions, with alphas from fb_forward, and err [B], a bound on the relative error of
   Z from the values fb_forward dropped: the mass a dropped value carried into Z is that value
   times the backward score of its state, divided by sum_s alpha beta at its position (everything
   rescaled alike).
   With weights g [B], the gradients of sum_b g[b] log Z[b]: gm weighted, gw [S, S] summed over the
   rows, and the start and end gradients added into gs [S] and ge [S]; without (g NULL), per row:
   gm unweighted, gw [B, S, S], gs and ge unused. Outputs zero-initialised by the caller. The
   normalisers of node and edge marginals must exceed `floor`: terms lost to underflow are then
   below exp(-708) / floor of them. Returns 1 if certified. */
int fb_backward(int64_t B, int64_t T, int64_t S, int64_t C, const int64_t* col, const double* w, const double* en,
                const double* em, const double* probs, const double* shifts, const int64_t* len, const double* al,
                const double* g, double tiny, double floor, double* gs, double* gw, double* ge, double* gm,
                double* err) {
  double* ew = malloc(sizeof(double) * (3 * S * S + 5 * S));
  double *ewt = ew + S * S, *beta = ewt + S * S, *raw = beta + S, *q = raw + S, *factors = q + S;
  double *q_dense = factors + S, *edges = q_dense + S;  /* edges [S, dense]: sums at the dense destinations */
  int ok = 1;
  for (int64_t i = 0; i < S * S; ++i) ew[i] = exp(w[i]);
  for (int64_t j = 0; j < S; ++j)  /* transposed: raw = expW q as a sum of columns, vectorised */
    for (int64_t k = 0; k < S; ++k) ewt[k * S + j] = ew[j * S + k];
  const double w_low = exp_low(w, S * S, &ok);
  Moves moves;
  moves_init(&moves, ew, S);
  const int64_t dense = moves.dense;
  for (int64_t b = 0; b < B && ok; ++b) {
    const int64_t n = len[b];
    err[b] = 0.0;
    if (n == 0) continue;
    const double gb = g ? g[b] : 1.0;
    double* gwb = g ? gw : gw + b * S * S;
    if (!moves.identity) for (int64_t i = 0; i < S * dense; ++i) edges[i] = 0.0;
    double peak = 0.0;
    for (int64_t k = 0; k < S; ++k) { beta[k] = exp(en[k]); peak = larger(peak, beta[k]); }
    if (!(peak > 0.0) || !isfinite(peak)) { ok = 0; break; }
    for (int64_t k = 0; k < S; ++k) beta[k] /= peak;
    if (!entering_ok(beta, S, tiny)) { ok = 0; break; }
    for (int64_t t = n - 1; t >= 0; --t) {
      const int64_t at = (b * T + t) * S;
      const double* a = al + at;
      double* m = gm + at;
      double d = 0.0, lost = 0.0;
      for (int64_t k = 0; k < S; ++k) {
        if (a[k] > 0.0) d += a[k] * beta[k];
        else lost -= a[k] * beta[k];
      }
      if (!(d > floor) || !isfinite(d)) { ok = 0; break; }
      err[b] += lost / d;
      const double scale = gb / d;
      for (int64_t k = 0; k < S; ++k) m[k] = larger(0.0, a[k]) * beta[k] * scale;
      if (g && t == n - 1) for (int64_t k = 0; k < S; ++k) ge[k] += m[k];
      if (t == 0) { if (g) for (int64_t k = 0; k < S; ++k) gs[k] += m[k]; break; }
      /* q = probs_t * beta_t; raw = expW q is beta_{t-1} before rescaling; edges / sum(alpha_{t-1} raw) */
      const int64_t column = (b * T + t) * C;
      const double* p = state_factors(probs + column, col, S, factors);
      const double p_low = prob_low(probs + column, em + column, C, &ok);
      if (!entering_ok(beta, S, larger(tiny, tiny / (w_low * p_low)))) ok = 0;
      for (int64_t k = 0; k < S; ++k) q[k] = p[k] * beta[k];
      const double* prev = a - S;
      for (int64_t j = 0; j < S; ++j) raw[j] = 0.0;
      for (int64_t i = 0; i < dense; ++i) {
        const int64_t k = moves.cols[i];
        const double qk = q[k];
        if (qk == 0.0) continue;
        const double* into_k = ewt + k * S;
        for (int64_t j = 0; j < S; ++j) raw[j] += into_k[j] * qk;
      }
      for (int64_t i = 0; i < moves.count; ++i) raw[moves.from[i]] += moves.value[i] * q[moves.to[i]];
      double dp = 0.0;
      for (int64_t j = 0; j < S; ++j) dp += larger(0.0, prev[j]) * raw[j];
      if (!(dp > floor) || !isfinite(dp)) { ok = 0; break; }
      const double edge_scale = gb / dp;
      const double* qd = q;
      if (!moves.identity) {
        for (int64_t i = 0; i < dense; ++i) q_dense[i] = q[moves.cols[i]];
        qd = q_dense;
      }
      double* sums = moves.identity ? gwb : edges;
      for (int64_t j = 0; j < S; ++j) {
        const double aj = prev[j] * edge_scale;
        if (aj <= 0.0) continue;
        const double* row = moves.rows + j * dense;
        double* out = sums + j * dense;
        for (int64_t i = 0; i < dense; ++i) out[i] += aj * row[i] * qd[i];
      }
      for (int64_t i = 0; i < moves.count; ++i) {
        const double aj = prev[moves.from[i]] * edge_scale;
        if (aj > 0.0) gwb[moves.from[i] * S + moves.to[i]] += aj * moves.value[i] * q[moves.to[i]];
      }
      peak = 0.0;
      for (int64_t j = 0; j < S; ++j) peak = larger(peak, raw[j]);
      if (!(peak > 0.0) || !isfinite(peak)) { ok = 0; break; }
      const double inverse = 1.0 / peak;
      for (int64_t j = 0; j < S; ++j) beta[j] = raw[j] * inverse;
    }
    if (!moves.identity)
      for (int64_t j = 0; j < S; ++j)
        for (int64_t i = 0; i < dense; ++i) gwb[j * S + moves.cols[i]] += edges[j * dense + i];
  }
  moves_free(&moves);
  free(ew);
  return ok;
}

/* Emission gradients out [B, T, C] (the emissions' dtype) from node marginals m [B, T, S] (float64):
   each state's value added into its column col[k] (col NULL: C = S), times g[b] for row b when
   g [B] is given (per-row marginals and gradient weights). The columns states k >= C repeat are
   summed in float64, from a list made once: (column, state) pairs in order of column. */
#define FOLD(NAME, REAL)                                                                           \
void NAME(int64_t B, int64_t T, int64_t S, int64_t C, const int64_t* col, const double* m,          \
          const double* g, REAL* out) {                                                            \
  const int64_t extra = col ? S - C : 0;                                                           \
  int64_t* pairs = malloc(sizeof(int64_t) * (2 * extra + 1));                                      \
  int64_t count = 0;                                                                               \
  for (int64_t c = 0; c < C && extra; ++c)                                                         \
    for (int64_t k = C; k < S; ++k)                                                                \
      if (col[k] == c) { pairs[2 * count] = c; pairs[2 * count + 1] = k; ++count; }                \
  for (int64_t b = 0; b < B; ++b) {                                                                \
    const double gb = g ? g[b] : 1.0;                                                              \
    for (int64_t t = 0; t < T; ++t) {                                                              \
      const double* mt = m + (b * T + t) * S;                                                      \
      REAL* o = out + (b * T + t) * C;                                                             \
      for (int64_t c = 0; c < C; ++c) o[c] = (REAL)(mt[c] * gb);                                   \
      for (int64_t i = 0; i < count;) {                                                            \
        const int64_t c = pairs[2 * i];                                                            \
        double sum = mt[c];                                                                        \
        for (; i < count && pairs[2 * i] == c; ++i) sum += mt[pairs[2 * i + 1]];                  \
        o[c] = (REAL)(sum * gb);                                                                   \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  free(pairs);                                                                                     \
}
FOLD(fold_f32, float)
FOLD(fold_f64, double)

/* Viterbi: states [B, T] (-1 past each length and in rows without a path), best scores [B], with
   emissions e [B, T, C] (state k scores column col[k]; col NULL: C = S). The sums are those of
   the torch scan, score[j] + (w[j, k] + e[t, k]), and ties go to the first index: a maximum over
   the candidates (a loop the compiler vectorises, over the transposed transitions), then the
   first candidate equal to it. Sources with a -inf transition into k are skipped when
   there are any (the precursor CRF's O states are entered from one memory each); a state that no
   source reaches gets -inf and pointer 0, as in the dense scan. */
#define VITERBI(NAME, REAL)                                                                        \
void NAME(int64_t B, int64_t T, int64_t S, int64_t C, const int64_t* col, const REAL* st,          \
          const REAL* w, const REAL* en, const REAL* e, const int64_t* len, int64_t* out,          \
          REAL* best) {                                                                            \
  REAL* score = malloc(sizeof(REAL) * (3 * S + S * S));                                            \
  REAL *next = score + S, *cand = next + S, *wt = cand + S;                                        \
  int64_t* back = malloc(sizeof(int64_t) * (T > 0 ? T : 1) * S);                                   \
  int64_t* from = malloc(sizeof(int64_t) * (S * S + S));                                           \
  int64_t* count = from + S * S;                                                                   \
  for (int64_t k = 0; k < S; ++k) {                                                                \
    count[k] = 0;                                                                                  \
    for (int64_t j = 0; j < S; ++j) {                                                              \
      wt[k * S + j] = w[j * S + k];                                                                \
      if (w[j * S + k] > -INFINITY) from[k * S + count[k]++] = j;                                  \
    }                                                                                              \
  }                                                                                                \
  for (int64_t b = 0; b < B; ++b) {                                                                \
    const int64_t n = len[b];                                                                      \
    int64_t* path = out + b * T;                                                                   \
    for (int64_t t = 0; t < T; ++t) path[t] = -1;                                                  \
    best[b] = 0;                                                                                   \
    if (n == 0) continue;                                                                          \
    const REAL* eb = e + b * T * C;                                                                \
    for (int64_t k = 0; k < S; ++k) score[k] = st[k] + eb[col ? col[k] : k];                       \
    for (int64_t t = 1; t < n; ++t) {                                                              \
      for (int64_t k = 0; k < S; ++k) {                                                            \
        const REAL ek = eb[t * C + (col ? col[k] : k)];                                            \
        const REAL* column = wt + k * S;                                                           \
        REAL top = -INFINITY;                                                                      \
        int64_t arg = 0;                                                                           \
        if (count[k] == S) {                                                                       \
          for (int64_t j = 0; j < S; ++j) {                                                        \
            cand[j] = score[j] + (column[j] + ek);                                                 \
            top = cand[j] > top ? cand[j] : top;                                                   \
          }                                                                                        \
          while (arg < S - 1 && !(cand[arg] == top)) ++arg;                                        \
        } else {                                                                                   \
          const int64_t* sources = from + k * S;                                                   \
          for (int64_t c = 0; c < count[k]; ++c) {                                                 \
            const int64_t j = sources[c];                                                          \
            const REAL v = score[j] + (column[j] + ek);                                            \
            if (v > top) { top = v; arg = j; }                                                     \
          }                                                                                        \
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
  free(from);                                                                                      \
}
VITERBI(viterbi_f32, float)
VITERBI(viterbi_f64, double)

/* Score of the state paths y [B, T] (entries past each length ignored; returns 0 if an entry before
   is outside [0, S)), summed in float64, with emissions e [B, T, C] (state k scores column col[k];
   col NULL: C = S), and its gradient: g[b] added at every score the path of row b uses (outputs
   zero-initialised by the caller; gm [B, T, C]). */
#define GOLD(NAME, BACKWARD, REAL)                                                                 \
int NAME(int64_t B, int64_t T, int64_t S, int64_t C, const int64_t* col, const REAL* st,           \
         const REAL* w, const REAL* en, const REAL* e, const int64_t* y, const int64_t* len,       \
         REAL* out) {                                                                              \
  for (int64_t b = 0; b < B; ++b) {                                                                \
    const int64_t n = len[b];                                                                      \
    const int64_t* yb = y + b * T;                                                                 \
    const REAL* eb = e + b * T * C;                                                                \
    double total = 0; /* float64 whatever REAL: float32 sums of long paths lose digits */          \
    for (int64_t t = 0; t < n; ++t) if (yb[t] < 0 || yb[t] >= S) return 0;                         \
    if (n > 0) {                                                                                   \
      if (col) for (int64_t t = 0; t < n; ++t) total += eb[t * C + col[yb[t]]];                   \
      else for (int64_t t = 0; t < n; ++t) total += eb[t * C + yb[t]];                             \
      for (int64_t t = 1; t < n; ++t) total += w[yb[t - 1] * S + yb[t]];                           \
      total += (double)st[yb[0]] + (double)en[yb[n - 1]];                                          \
    }                                                                                              \
    out[b] = (REAL)total;                                                                          \
  }                                                                                                \
  return 1;                                                                                        \
}                                                                                                  \
void BACKWARD(int64_t B, int64_t T, int64_t S, int64_t C, const int64_t* col, const int64_t* y,    \
              const int64_t* len, const REAL* g, REAL* gs, REAL* gw, REAL* ge, REAL* gm) {         \
  for (int64_t b = 0; b < B; ++b) {                                                                \
    const int64_t n = len[b];                                                                      \
    if (n == 0) continue;                                                                          \
    const int64_t* yb = y + b * T;                                                                 \
    for (int64_t t = 0; t < n; ++t) gm[(b * T + t) * C + (col ? col[yb[t]] : yb[t])] += g[b];      \
    for (int64_t t = 1; t < n; ++t) gw[yb[t - 1] * S + yb[t]] += g[b];                             \
    gs[yb[0]] += g[b];                                                                             \
    ge[yb[n - 1]] += g[b];                                                                         \
  }                                                                                                \
}
GOLD(gold_f32, gold_backward_f32, float)
GOLD(gold_f64, gold_backward_f64, double)
