"""Triton kernels of the chain engine: one program per batch row, the row's state scores on chip,
the loop over positions inside the kernel.

State layout. A state space ``S = (C,) * order`` (order 1 or 2) is held as two 2-D tiles:

- destination layout ``[BB, BC]``: state ``(m, c)`` with flat index ``m * C + c`` (order 2: a
  pair ``(b, c)``; order 1: ``m = 0`` and the flat index is the tag ``c``);
- source layout ``[BA, BB]``: state ``(a, m)`` with flat index ``a * NB + m`` (``NB = C`` for
  order 2, ``1`` for order 1, where ``a`` is the tag).

One step moves ``(a, m) -> (m, c)`` through the transition tile ``W [BA, BB, BC]`` (flat
``[*S, C]``) and reduces axis 0: the new scores come out in destination layout, and
:func:`_to_source` relabels them for the next step (identity for pairs, a reshape ``[1, C] ->
[C, 1]`` for order 1). Second order therefore costs O(C^3) per step, never a dense C^2 x C^2.

Numerics. Scores are rescaled log values: each position subtracts its largest emission and its
largest score, and the subtracted amounts are accumulated in float64 (the per-position log scale
``L_t``). The backward kernel works with the same shifts, so every float32 operation sees values
of moderate size whatever the magnitude of the emissions. ``-inf`` scores (constraints, padding
lanes of non-power-of-two blocks) stay exact; rows without any finite path give ``-inf``.

State spaces whose tile does not fit one program's registers run the blocked variants of these
kernels (:mod:`.blocked`); the choice is made per call by :func:`.runtime.plan`.

The kernels read the compute dtype from ``start`` (float32 or float64); emissions of any float
dtype are upcast on load. Search (Viterbi, k best) always computes in float64 with the same order
of additions as the torch engine, so scores and ties are identical.
"""

from __future__ import annotations

import triton
import triton.language as tl

NEG_INF = tl.constexpr(float("-inf"))
BIG_KEY = tl.constexpr(1 << 30)


@triton.jit
def _to_source(x, BA: tl.constexpr, BB: tl.constexpr, ORDER: tl.constexpr):
    """Destination-layout ``[BB, BC]`` tile -> source layout ``[BA, BB]`` of the next step."""
    if ORDER == 1:
        y = tl.reshape(x, (BA, BB))
    else:
        y = x
    return y


@triton.jit
def _to_source_ranked(x, BA: tl.constexpr, BB: tl.constexpr, BK: tl.constexpr, ORDER: tl.constexpr):
    """``[BB, BC, BK]`` -> ``[BA, BB, BK]`` (the rank axis rides along)."""
    if ORDER == 1:
        y = tl.reshape(x, (BA, BB, BK))
    else:
        y = x
    return y


@triton.jit
def _to_dest(x, BB: tl.constexpr, BC: tl.constexpr, ORDER: tl.constexpr):
    """Source-layout ``[BA, BB]`` tile -> destination layout ``[BB, BC]``."""
    if ORDER == 1:
        y = tl.reshape(x, (BB, BC))
    else:
        y = x
    return y


@triton.jit
def _layout(C, NB, BA: tl.constexpr, BB: tl.constexpr, BC: tl.constexpr):
    """Index vectors, flat state offsets and validity masks of both layouts."""
    a = tl.arange(0, BA)
    m = tl.arange(0, BB)
    c = tl.arange(0, BC)
    src = a[:, None] * NB + m[None, :]
    src_ok = (a[:, None] < C) & (m[None, :] < NB)
    dst = m[:, None] * C + c[None, :]
    dst_ok = (m[:, None] < NB) & (c[None, :] < C)
    return a, m, c, src, src_ok, dst, dst_ok


# Reductions through tl.reduce with triton's own combine functions, not tl.max / tl.sum: those are
# @triton.jit functions decorated when triton is imported, so an interpreted kernel could not call
# them unless TRITON_INTERPRET was set before that import; the interpreter runs these combine
# functions natively (numpy) whatever the import order.
@triton.jit
def _max(x, axis: tl.constexpr):
    return tl.reduce(x, axis, tl.standard._elementwise_max)


@triton.jit
def _min(x, axis: tl.constexpr):
    return tl.reduce(x, axis, tl.standard._elementwise_min)


@triton.jit
def _sum(x, axis: tl.constexpr):
    return tl.reduce(x, axis, tl.standard._sum_combine)


@triton.jit
def _finite_or_zero(x):
    return tl.where(x == NEG_INF, 0.0, x)


@triton.jit
def _both(mask, flag):
    """``mask & flag`` for a scalar ``flag`` (written as a where: Triton's interpreter turns
    ``tensor & scalar`` masks into integers)."""
    return tl.where(flag, mask, False)


@triton.jit
def _max2(x):
    return _max(_max(x, 1), 0)


@triton.jit
def forward_kernel(start_ptr, moves_ptr, end_ptr, em_ptr, len_ptr, logz_ptr, alpha_ptr, scale_ptr,
                   T, C, NB, s_eb, s_et, s_em, s_el,
                   ORDER: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr, BC: tl.constexpr,
                   PER_POSITION: tl.constexpr, STORE: tl.constexpr):
    """log Z of one row; with ``STORE`` also the rescaled forward scores ``alpha [B, T, N]`` and
    the float64 log scale ``scale [B, T]`` of every position (log alpha_t = alpha_t + scale_t)."""
    row = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(len_ptr + row).to(tl.int32), 0), T)  # lengths outside [0, T] clamped
    N = NB * C
    dtype = start_ptr.dtype.element_ty
    a, m, c, src, src_ok, dst, dst_ok = _layout(C, NB, BA, BB, BC)
    em_off = m[:, None] * s_em + c[None, :] * s_el
    em_row = em_ptr + row * s_eb
    w_off = src[:, :, None] * C + c[None, None, :]
    w_ok = src_ok[:, :, None] & (c[None, None, :] < C)

    e = tl.load(em_row + em_off, mask=_both(dst_ok, n > 0), other=NEG_INF).to(dtype)
    e_max = _finite_or_zero(_max2(e))
    x = tl.load(start_ptr + dst, mask=dst_ok, other=NEG_INF).to(dtype) + (e - e_max)
    shift = _max2(x)
    x = x - _finite_or_zero(shift)
    scale = e_max.to(tl.float64) + shift.to(tl.float64)
    if STORE:
        tl.store(alpha_ptr + row * T * N + dst, x, mask=_both(dst_ok, n > 0))
        tl.store(scale_ptr + row * T, scale, mask=n > 0)
    moves = tl.load(moves_ptr + w_off, mask=w_ok, other=NEG_INF).to(dtype)
    # the inputs of position t + 1 are loaded during step t: their memory latency hides behind it
    e_next = tl.load(em_row + s_et + em_off, mask=_both(dst_ok, n > 1), other=NEG_INF)
    moves_next = moves
    if PER_POSITION:
        moves_next = tl.load(moves_ptr + (row * T + 1) * N * C + w_off, mask=_both(w_ok, n > 1),
                             other=NEG_INF).to(dtype)
    for t in range(1, n):
        e = e_next.to(dtype)
        e_next = tl.load(em_row + (t + 1) * s_et + em_off, mask=_both(dst_ok, t + 1 < n), other=NEG_INF)
        if PER_POSITION:
            moves = moves_next
            moves_next = tl.load(moves_ptr + (row * T + t + 1) * N * C + w_off, mask=_both(w_ok, t + 1 < n),
                                 other=NEG_INF).to(dtype)
        prev = _to_source(x, BA, BB, ORDER)
        s = prev[:, :, None] + moves
        peak = _finite_or_zero(_max(s, 0))
        total = _sum(tl.exp(s - peak[None, :, :]), 0)
        e_max = _finite_or_zero(_max2(e))
        x = peak + tl.log(total) + (e - e_max)
        shift = _max2(x)
        x = x - _finite_or_zero(shift)
        scale = scale + e_max.to(tl.float64) + shift.to(tl.float64)
        if STORE:
            tl.store(alpha_ptr + (row * T + t) * N + dst, x, mask=dst_ok)
            tl.store(scale_ptr + row * T + t, scale)
    z = x + tl.load(end_ptr + dst, mask=dst_ok, other=NEG_INF).to(dtype)
    z_max = _finite_or_zero(_max2(z))
    log_z = scale + (z_max + tl.log(_sum(_sum(tl.exp(z - z_max), 1), 0))).to(tl.float64)
    tl.store(logz_ptr + row, tl.where(n > 0, log_z, 0.0))


@triton.jit
def backward_kernel(moves_ptr, end_ptr, em_ptr, len_ptr, logz_ptr, grad_ptr, alpha_ptr, scale_ptr,
                    d_em_ptr, d_start_ptr, d_end_ptr, d_moves_ptr,
                    T, C, NB, s_eb, s_et, s_em, s_el,
                    ORDER: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr, BC: tl.constexpr,
                    PER_POSITION: tl.constexpr, MOVES: tl.constexpr):
    """The backward scan of one row: node marginals times ``grad[row]`` into ``d_em [B, T, N]``
    (zero-initialised), the row's start and end terms into ``d_start``, ``d_end [B, N]``, and with
    ``MOVES`` the edge marginals: summed over positions into ``d_moves [B, N, C]`` (float64) for
    shared transitions, per position into ``d_moves [B, T, N, C]`` (zero-initialised) otherwise.
    Rows of length 0 and rows without a path (log Z = -inf) contribute zeros."""
    row = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(len_ptr + row).to(tl.int32), 0), T)  # lengths outside [0, T] clamped
    N = NB * C
    dtype = alpha_ptr.dtype.element_ty
    a, m, c, src, src_ok, dst, dst_ok = _layout(C, NB, BA, BB, BC)
    em_off = m[:, None] * s_em + c[None, :] * s_el
    em_row = em_ptr + row * s_eb
    w_off = src[:, :, None] * C + c[None, None, :]
    w_ok = src_ok[:, :, None] & (c[None, None, :] < C)

    log_z = tl.load(logz_ptr + row)
    live = (n > 0) & (log_z > NEG_INF)
    log_z = tl.where(live, log_z, 0.0)
    steps = tl.where(live, n, 0)
    weight = tl.where(live, tl.load(grad_ptr + row).to(dtype), 0.0)  # an inf weight on a dead row: no NaN
    last = tl.maximum(steps - 1, 0)

    b = tl.load(end_ptr + dst, mask=dst_ok, other=NEG_INF).to(dtype)
    b_max = _max2(b)
    b = b - _finite_or_zero(b_max)
    beta_scale = b_max.to(tl.float64)
    alpha_scale = tl.load(scale_ptr + row * T + last, mask=live, other=0.0)
    x = tl.load(alpha_ptr + (row * T + last) * N + dst, mask=_both(dst_ok, live), other=NEG_INF)
    node = tl.exp(x + b + (alpha_scale + beta_scale - log_z).to(dtype))
    node = tl.where(live, node, 0.0) * weight
    tl.store(d_end_ptr + row * N + dst, node, mask=dst_ok)
    tl.store(d_em_ptr + (row * T + last) * N + dst, node, mask=_both(dst_ok, live))
    moves = tl.load(moves_ptr + w_off, mask=w_ok, other=NEG_INF).to(dtype)
    total = tl.full((BA, BB, BC), 0, tl.float64)
    # what step t needs on its critical path is loaded during step t + 1
    e_next = tl.load(em_row + last * s_et + em_off, mask=_both(dst_ok, steps > 1), other=NEG_INF)
    scale_next = tl.load(scale_ptr + row * T + last - 1, mask=steps > 1, other=0.0)
    for i in range(1, steps):
        t = steps - i
        e = e_next.to(tl.float64)
        prev_scale = scale_next
        e_next = tl.load(em_row + (t - 1) * s_et + em_off, mask=_both(dst_ok, t > 1), other=NEG_INF)
        scale_next = tl.load(scale_ptr + row * T + t - 2, mask=t > 1, other=0.0)
        shift = alpha_scale - prev_scale  # what the forward scan took out of position t
        ahead = (e - shift).to(dtype) + b
        if PER_POSITION:
            moves = tl.load(moves_ptr + (row * T + t) * N * C + w_off, mask=w_ok, other=NEG_INF).to(dtype)
        s = moves + ahead[None, :, :]
        if MOVES:
            before = tl.load(alpha_ptr + (row * T + t - 1) * N + src, mask=src_ok, other=NEG_INF)
            edge = tl.exp(before[:, :, None] + s + (alpha_scale + beta_scale - log_z).to(dtype)) * weight
            if PER_POSITION:
                tl.store(d_moves_ptr + (row * T + t) * N * C + w_off, edge, mask=w_ok)
            else:
                total += edge.to(tl.float64)
        peak = _finite_or_zero(_max(s, 2))
        back = _to_dest(peak + tl.log(_sum(tl.exp(s - peak[:, :, None]), 2)), BB, BC, ORDER)
        b_max = _max2(back)
        b = back - _finite_or_zero(b_max)
        beta_scale = beta_scale + shift + b_max.to(tl.float64)
        alpha_scale = prev_scale
        x = tl.load(alpha_ptr + (row * T + t - 1) * N + dst, mask=dst_ok, other=NEG_INF)
        node = tl.exp(x + b + (alpha_scale + beta_scale - log_z).to(dtype)) * weight
        tl.store(d_em_ptr + (row * T + t - 1) * N + dst, node, mask=dst_ok)
    tl.store(d_start_ptr + row * N + dst, node, mask=dst_ok)
    if MOVES:
        if not PER_POSITION:
            tl.store(d_moves_ptr + row * N * C + w_off, total, mask=w_ok)


@triton.jit
def search_kernel(start_ptr, moves_ptr, end_ptr, em_ptr, len_ptr, pointer_ptr, states_ptr, scores_ptr,
                  T, C, NB, K, s_eb, s_et, s_em, s_el,
                  ORDER: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                  PER_POSITION: tl.constexpr):
    """The ``K`` best paths of one row (``K = 1``: Viterbi) in float64, back-pointers ``[B, T, N,
    K]`` (int32, ``source tag * K + rank``) and the backtrace: flat states into ``states [B, K, T]``
    (pre-filled with -1) and scores into ``scores [B, K]``.

    Candidates for each destination are ranked by score, ties by ``source tag * K + rank`` (the
    order of the torch engine's stable sort); the last step ranks ``(state, rank)`` as the torch
    engine's two END steps do (order 2: by the pair's second tag first). A picked candidate is set
    to ``-inf``: once only ``-inf`` candidates are left, the picks (and their back-pointers) are
    arbitrary, which is harmless: no finite path leads through them, and missing paths come out as
    score ``-inf`` and states -1. Padding lanes (tags >= C, ranks >= K) are ``-inf`` throughout."""
    row = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(len_ptr + row).to(tl.int32), 0), T)  # lengths outside [0, T] clamped
    N = NB * C
    a, m, c, src, src_ok, dst, dst_ok = _layout(C, NB, BA, BB, BC)
    r = tl.arange(0, BK)
    em_off = m[:, None] * s_em + c[None, :] * s_el
    em_row = em_ptr + row * s_eb
    w_off = src[:, :, None] * C + c[None, None, :]
    w_ok = src_ok[:, :, None] & (c[None, None, :] < C)

    e = tl.load(em_row + em_off, mask=_both(dst_ok, n > 0), other=NEG_INF).to(tl.float64)
    first = tl.load(start_ptr + dst, mask=dst_ok, other=NEG_INF).to(tl.float64) + e
    score = tl.where(r[None, None, :] == 0, first[:, :, None], NEG_INF)  # [BB, BC, BK]
    moves = tl.load(moves_ptr + w_off, mask=w_ok, other=NEG_INF).to(tl.float64)
    key = a[:, None, None, None] * K + r[None, None, None, :]  # [BA, 1, 1, BK]
    pointer_off = dst[:, :, None] * K + r[None, None, :]
    pointer_ok = dst_ok[:, :, None] & (r[None, None, :] < K)
    e_next = tl.load(em_row + s_et + em_off, mask=_both(dst_ok, n > 1), other=NEG_INF)
    moves_next = moves
    if PER_POSITION:
        moves_next = tl.load(moves_ptr + (row * T + 1) * N * C + w_off, mask=_both(w_ok, n > 1),
                             other=NEG_INF).to(tl.float64)
    for t in range(1, n):
        e = e_next.to(tl.float64)  # loaded one step ahead, as in the forward kernel
        e_next = tl.load(em_row + (t + 1) * s_et + em_off, mask=_both(dst_ok, t + 1 < n), other=NEG_INF)
        if PER_POSITION:
            moves = moves_next
            moves_next = tl.load(moves_ptr + (row * T + t + 1) * N * C + w_off, mask=_both(w_ok, t + 1 < n),
                                 other=NEG_INF).to(tl.float64)
        prev = _to_source_ranked(score, BA, BB, BK, ORDER)
        cand = prev[:, :, None, :] + moves[:, :, :, None]  # [BA, BB, BC, BK]
        best = tl.full((BB, BC, BK), NEG_INF, tl.float64)
        pointer = tl.full((BB, BC, BK), 0, tl.int32)
        for j in range(0, K):
            top = _max(_max(cand, 3), 0)  # [BB, BC]
            pick = _min(_min(tl.where(cand == top[None, :, :, None], key, BIG_KEY), 3), 0)
            cand = tl.where(key == pick[None, :, :, None], NEG_INF, cand)  # taken
            best = tl.where(r[None, None, :] == j, top[:, :, None], best)
            pointer = tl.where(r[None, None, :] == j, pick[:, :, None], pointer)
        score = best + e[:, :, None]
        tl.store(pointer_ptr + (row * T + t) * N * K + pointer_off, pointer, mask=pointer_ok)

    # the move to END: rank (state, rank) pairs by score, ties by (second tag, first tag, rank)
    prev = _to_source_ranked(score, BA, BB, BK, ORDER)
    final = prev + tl.load(end_ptr + src, mask=src_ok, other=NEG_INF).to(tl.float64)[:, :, None]
    final_key = m[None, :, None] * (C * K) + a[:, None, None] * K + r[None, None, :]
    best = tl.full((BK,), NEG_INF, tl.float64)
    state = tl.full((BK,), 0, tl.int64)
    rank = tl.full((BK,), 0, tl.int64)
    for j in range(0, K):
        top = _max(_max(_max(final, 2), 1), 0)
        pick = _min(_min(_min(tl.where(final == top, final_key, BIG_KEY), 2), 1), 0)
        final = tl.where(final_key == pick, NEG_INF, final)
        best = tl.where(r == j, top, best)
        state = tl.where(r == j, ((pick % (C * K)) // K) * NB + pick // (C * K), state)
        rank = tl.where(r == j, pick % K, rank)
    _backtrace(pointer_ptr, states_ptr, scores_ptr, row, n, T, C, NB, K, r, best, state, rank)


@triton.jit
def _backtrace(pointer_ptr, states_ptr, scores_ptr, row, n, T, C, NB, K, r, best, state, rank):
    """Store the ranked final ``best [BK]`` scores and follow the back-pointers from the final
    ``state`` and ``rank`` of each path back to the first position (flat states into ``states``)."""
    best = tl.where(n > 0, best, tl.where(r == 0, 0.0, NEG_INF))  # length 0: one empty path
    tl.store(scores_ptr + row * K + r, best, mask=r < K)
    N = NB * C
    tl.debug_barrier()  # the back-pointers of every thread of this program are written
    found = _both((best > NEG_INF) & (r < K), n > 0)
    out = states_ptr + (row * K + r) * T
    tl.store(out + n - 1, state, mask=found)
    for i in range(1, n):
        t = n - i
        p = tl.load(pointer_ptr + ((row * T + t) * N + state) * K + rank, mask=found, other=0).to(tl.int64)
        state = (p // K) * NB + state // C
        rank = p % K
        tl.store(out + t - 1, state, mask=found)
