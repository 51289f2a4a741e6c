"""Triton kernels of the chain engine: one program per batch row, the row's state scores on chip,
the loop over positions inside the kernel.

State layout. A state space ``S = (C,) * order`` (order 1 or 2) is held as two 2-D tiles:

- destination layout ``[BB, BC]``: state ``(m, c)`` with flat index ``m * C + c`` (order 2: a
  pair ``(b, c)``; order 1: ``m = 0`` and the flat index is the tag ``c``);
- source layout ``[BA, BB]``: state ``(a, m)`` with flat index ``a * NB + m`` (``NB = C`` for
  order 2, ``1`` for order 1, where ``a`` is the tag).

One step moves ``(a, m) -> (m, c)`` through the transition tile ``W [BA, BB, BC]`` (flat
``[*S, C]``) and reduces axis 0: the new scores come out in destination layout, and
:func:`_relabel` relabels them for the next step (identity for pairs, a reshape ``[1, C] ->
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
def _relabel(x, D0: tl.constexpr, D1: tl.constexpr, BK: tl.constexpr, ORDER: tl.constexpr):
    """A tile of one state layout in the other, ``[D0, D1]`` (``BK > 0``: ``[D0, D1, BK]``, a rank
    axis riding along): destination ``[BB, BC]`` -> source ``[BA, BB]`` or back. A reshape for
    order 1, the identity for pairs."""
    if ORDER == 1:
        if BK == 0:
            y = tl.reshape(x, (D0, D1))
        else:
            y = tl.reshape(x, (D0, D1, BK))
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


@triton.jit
def _add(x, y):
    return x + y


@triton.jit
def _positions(mask_ptr, pos_ptr, row, T, BT: tl.constexpr):
    """Write the original positions of the row's True mask positions, in order, into ``pos [B,
    T]`` (the compaction of the row, done on chip: a prefix sum over blocks of ``BT`` positions)."""
    base = tl.full([], 0, tl.int32)
    for t0 in range(0, T, BT):
        t = t0 + tl.arange(0, BT)
        keep = tl.load(mask_ptr + row * T + t, mask=t < T, other=0).to(tl.int32)
        index = tl.associative_scan(keep, 0, _add) + base - 1
        tl.store(pos_ptr + row * T + index, t, mask=keep != 0)
        base += tl.reduce(keep, 0, _add)
    tl.debug_barrier()  # every thread of the program reads what the others wrote


@triton.jit
def _row_start(len_ptr, mask_ptr, pos_ptr, T, MASKED: tl.constexpr, BT: tl.constexpr):
    """The program's row and its length ``n`` (clamped to ``[0, T]``); with ``MASKED == 1`` the
    positions of the mask row are computed here (see :func:`_positions`)."""
    row = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(len_ptr + row).to(tl.int32), 0), T)
    if MASKED == 1:
        _positions(mask_ptr, pos_ptr, row, T, BT)
    return row, n


@triton.jit
def _columns(col_ptr, c, C, COLUMNS: tl.constexpr):
    """The emission column of last components ``c`` (-1: none): ``col[c]`` with ``COLUMNS``, else ``c``."""
    if COLUMNS:
        col = tl.load(col_ptr + c, mask=c < C, other=-1)
    else:
        col = c
    return col


@triton.jit
def _prologue(len_ptr, mask_ptr, pos_ptr, col_ptr, em_ptr, T, C, NB, s_eb, s_em, s_el,
              BA: tl.constexpr, BB: tl.constexpr, BC: tl.constexpr, MASKED: tl.constexpr, COLUMNS: tl.constexpr,
              BT: tl.constexpr):
    """What every single-tile kernel starts with: the row and its length (:func:`_row_start`),
    both layouts, the emission offsets and mask of the destination layout (state ``(m, c)`` reads
    column :func:`_columns`), the row's emissions and the transition tile's offsets and mask."""
    row, n = _row_start(len_ptr, mask_ptr, pos_ptr, T, MASKED, BT)
    a, m, c, src, src_ok, dst, dst_ok = _layout(C, NB, BA, BB, BC)
    col = _columns(col_ptr, c, C, COLUMNS)
    em_off = m[:, None] * s_em + col[None, :] * s_el
    em_ok = dst_ok & (col[None, :] >= 0)
    w_off = src[:, :, None] * C + c[None, None, :]
    w_ok = src_ok[:, :, None] & (c[None, None, :] < C)
    return row, n, a, m, c, src, src_ok, dst, dst_ok, col, em_off, em_ok, em_ptr + row * s_eb, w_off, w_ok


@triton.jit
def _at(pos_ptr, row, T, t, MASKED: tl.constexpr):
    """Original position of the row's compacted position ``t`` (``t`` itself without a mask;
    positions past ``T`` read as 0)."""
    if MASKED:
        p = tl.load(pos_ptr + row * T + t, mask=t < T, other=0).to(tl.int64)
    else:
        p = tl.full([], 0, tl.int64) + t
    return p


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
def _gold_state(tag_ptr, auto_ptr, row, T, p, source, L, valid, GOLD: tl.constexpr):
    """The gold state at original position ``p`` after state ``source`` (N, the number of
    states, at the first position) and whether the tag there is outside ``[0, L)`` (``GOLD ==
    1``: the state is the tag; 2: ``auto [N + 1, L]`` maps (previous state or N, tag) to the
    state)."""
    y = tl.load(tag_ptr + row * T + p, mask=valid, other=0)
    bad = (y < 0) | (y >= L)
    y = tl.minimum(tl.maximum(y, 0), L - 1).to(tl.int32)
    if GOLD == 1:
        state = y
    else:
        state = tl.load(auto_ptr + source * L + y, mask=valid, other=0)
    return state, bad


@triton.jit
def _gold_emission(em_row, col_ptr, p, state, C, s_et, s_em, s_el, valid, COLUMNS: tl.constexpr):
    """Emission of flat state ``state`` at original position ``p``, in float64."""
    last = state % C
    if COLUMNS:
        last = tl.load(col_ptr + last, mask=valid, other=0)
    return tl.load(em_row + p * s_et + (state // C) * s_em + last * s_el, mask=valid, other=0.0).to(tl.float64)


@triton.jit
def _gold_path(start_ptr, moves_ptr, end_ptr, em_row, pos_ptr, col_ptr, tag_ptr, auto_ptr, gold_ptr, row, n, T, C, N,
               L, s_et, s_em, s_el, MASKED: tl.constexpr, COLUMNS: tl.constexpr, GOLD: tl.constexpr):
    """The gold path's float64 score and whether a tag was bad, its states stored into ``gold``
    (the blocked kernels' separate pass over the positions; the single-tile kernel interleaves
    the same steps with its scan)."""
    p = _at(pos_ptr, row, T, 0, MASKED)
    g, bad = _gold_state(tag_ptr, auto_ptr, row, T, p, N, L, n > 0, GOLD)
    gold = (tl.load(start_ptr + g, mask=n > 0, other=0.0).to(tl.float64)
            + _gold_emission(em_row, col_ptr, p, g, C, s_et, s_em, s_el, n > 0, COLUMNS))
    tl.store(gold_ptr + row * T, g, mask=n > 0)
    for t in range(1, n):
        p = _at(pos_ptr, row, T, t, MASKED)
        g_prev = g
        g, wrong = _gold_state(tag_ptr, auto_ptr, row, T, p, g_prev, L, True, GOLD)
        bad = bad | wrong
        gold += (tl.load(moves_ptr + g_prev * C + g % C).to(tl.float64)
                 + _gold_emission(em_row, col_ptr, p, g, C, s_et, s_em, s_el, True, COLUMNS))
        tl.store(gold_ptr + row * T + t, g)
    gold += tl.load(end_ptr + g, mask=n > 0, other=0.0).to(tl.float64)
    return gold, bad


@triton.jit
def forward_kernel(start_ptr, moves_ptr, end_ptr, em_ptr, len_ptr, logz_ptr, alpha_ptr, scale_ptr,
                   mask_ptr, pos_ptr, col_ptr, tag_ptr, auto_ptr, gold_ptr, nll_ptr, norm_ptr,
                   T, C, NB, L, K, s_eb, s_et, s_em, s_el,
                   ORDER: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr, BC: tl.constexpr,
                   PER_POSITION: tl.constexpr, STORE: tl.constexpr, MASKED: tl.constexpr = 0,
                   COLUMNS: tl.constexpr = 0, GOLD: tl.constexpr = 0, NORMALIZE: tl.constexpr = 0,
                   BT: tl.constexpr = 16):
    """log Z of one row; with ``STORE`` also the rescaled forward scores ``alpha [B, T, N]`` and
    the float64 log scale ``scale [B, T]`` of every position (log alpha_t = alpha_t + scale_t).

    Options: ``MASKED`` (1: the row's positions are the True entries of ``mask [B, T]``, written
    into ``pos``; emissions are read at those positions), ``COLUMNS`` (see :func:`_prologue`),
    ``GOLD`` (the NLL of the tags ``tag [B, T]`` at the same positions, see :func:`_gold_state`:
    ``nll [B]`` gets ``log Z - score`` (+inf without a path, NaN for a tag outside ``[0, L)``) and
    ``gold [B, T]`` the compacted gold states for the backward kernel), ``NORMALIZE`` (subtract
    log Z from the finite entries of ``norm [B, K]``: path scores into log-probabilities)."""
    row, n, a, m, c, src, src_ok, dst, dst_ok, col, em_off, em_ok, em_row, w_off, w_ok = _prologue(
        len_ptr, mask_ptr, pos_ptr, col_ptr, em_ptr, T, C, NB, s_eb, s_em, s_el, BA, BB, BC, MASKED, COLUMNS, BT)
    N = NB * C
    dtype = start_ptr.dtype.element_ty

    p = _at(pos_ptr, row, T, 0, MASKED)
    e = tl.load(em_row + p * s_et + em_off, mask=_both(em_ok, n > 0), other=NEG_INF).to(dtype)
    e_max = _finite_or_zero(_max2(e))
    x = tl.load(start_ptr + dst, mask=dst_ok, other=NEG_INF).to(dtype) + (e - e_max)
    shift = _max2(x)
    x = x - _finite_or_zero(shift)
    scale = e_max.to(tl.float64) + shift.to(tl.float64)
    if STORE:
        tl.store(alpha_ptr + row * T * N + dst, x, mask=_both(dst_ok, n > 0))
        tl.store(scale_ptr + row * T, scale, mask=n > 0)
    if GOLD:
        g, bad = _gold_state(tag_ptr, auto_ptr, row, T, p, N, L, n > 0, GOLD)
        gold = (tl.load(start_ptr + g, mask=n > 0, other=0.0).to(tl.float64)
                + _gold_emission(em_row, col_ptr, p, g, C, s_et, s_em, s_el, n > 0, COLUMNS))
        tl.store(gold_ptr + row * T, g, mask=n > 0)
    moves = tl.load(moves_ptr + w_off, mask=w_ok, other=NEG_INF).to(dtype)
    # the inputs of position t + 1 are loaded during step t: their memory latency hides behind it
    p_next = _at(pos_ptr, row, T, 1, MASKED)
    e_next = tl.load(em_row + p_next * s_et + em_off, mask=_both(em_ok, n > 1), other=NEG_INF)
    moves_next = moves
    if PER_POSITION:
        moves_next = tl.load(moves_ptr + (row * T + 1) * N * C + w_off, mask=_both(w_ok, n > 1),
                             other=NEG_INF).to(dtype)
    for t in range(1, n):
        e = e_next.to(dtype)
        p = p_next
        p_next = _at(pos_ptr, row, T, t + 1, MASKED)
        e_next = tl.load(em_row + p_next * s_et + em_off, mask=_both(em_ok, t + 1 < n), other=NEG_INF)
        if PER_POSITION:
            moves = moves_next
            moves_next = tl.load(moves_ptr + (row * T + t + 1) * N * C + w_off, mask=_both(w_ok, t + 1 < n),
                                 other=NEG_INF).to(dtype)
        if GOLD:
            g_prev = g
            g, wrong = _gold_state(tag_ptr, auto_ptr, row, T, p, g_prev, L, True, GOLD)
            bad = bad | wrong
            into = moves_ptr + g_prev * C + g % C
            if PER_POSITION:
                into += (row * T + t) * N * C
            gold += (tl.load(into).to(tl.float64)
                     + _gold_emission(em_row, col_ptr, p, g, C, s_et, s_em, s_el, True, COLUMNS))
            tl.store(gold_ptr + row * T + t, g)
        prev = _relabel(x, BA, BB, 0, ORDER)
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
    log_z = tl.where(n > 0, log_z, 0.0)
    tl.store(logz_ptr + row, log_z)
    if GOLD:
        gold += tl.load(end_ptr + g, mask=n > 0, other=0.0).to(tl.float64)
        _finish_nll(nll_ptr, row, n, log_z, gold, bad)
    if NORMALIZE:
        _normalize(norm_ptr, row, K, log_z)


@triton.jit
def _finish_nll(nll_ptr, row, n, log_z, gold, bad):
    """Store ``log Z - gold`` (0 for an empty row, +inf without a path, NaN for a bad tag)."""
    nll = tl.where(log_z == NEG_INF, float("inf"), log_z - tl.where(n > 0, gold, 0.0))
    nll = tl.where(bad, float("nan"), nll)
    tl.store(nll_ptr + row, nll.to(nll_ptr.dtype.element_ty))


@triton.jit
def _normalize(norm_ptr, row, K, log_z):
    """Path scores ``norm [B, K]`` minus log Z where finite."""
    for j in range(0, K):
        score = tl.load(norm_ptr + row * K + j)
        tl.store(norm_ptr + row * K + j, tl.where(score == NEG_INF, score, score - log_z))


@triton.jit
def _dead_or_alive(len_ptr, logz_ptr, grad_ptr, row, n, s_g, dtype: tl.constexpr):
    """The backward kernels' view of a row: log Z (0 unless live), whether the row is live (a
    position and a finite log Z), its steps (0 unless live), its weight ``grad[row]`` (0 unless
    live: an inf weight on a dead row gives no NaN) and its last position."""
    log_z = tl.load(logz_ptr + row)
    live = (n > 0) & (log_z > NEG_INF)
    log_z = tl.where(live, log_z, 0.0)
    steps = tl.where(live, n, 0)
    weight = tl.where(live, tl.load(grad_ptr + row * s_g).to(dtype), 0.0)
    return log_z, live, steps, weight, tl.maximum(steps - 1, 0)


@triton.jit
def _node_grad(d_em_ptr, row, T, p, DW, dst, col, node, ok, COLUMNS: tl.constexpr):
    """Node gradients ``[BB, BC]`` of original position ``p`` into ``d_em``: per state (``[B, T,
    N]``), or added into the emission column each state reads (``COLUMNS``, ``[B, T, DW]``)."""
    if COLUMNS:
        target = d_em_ptr + (row * T + p) * DW + col[None, :] + dst * 0
        tl.atomic_add(target, node, mask=ok & (col[None, :] >= 0))
    else:
        tl.store(d_em_ptr + (row * T + p) * DW + dst, node, mask=ok)


@triton.jit
def _gold_count(index, state, weight, GOLD: tl.constexpr):
    """``weight`` where ``index == state`` (the gold path's count, with ``GOLD``), else 0. The
    gradients of start, end and transition scores leave out counts on ``-inf`` entries, which a
    gold path outside the constraints takes (its NLL is +inf): as a masked fill's gradient would."""
    if GOLD:
        count = tl.where(index == state, weight, 0.0)
    else:
        count = tl.where(index < 0, weight, 0.0)  # zeros of the tile's shape (index >= 0)
    return count


@triton.jit
def backward_kernel(start_ptr, moves_ptr, end_ptr, em_ptr, len_ptr, logz_ptr, grad_ptr, alpha_ptr, scale_ptr,
                    d_em_ptr, d_start_ptr, d_end_ptr, d_moves_ptr, mask_ptr, pos_ptr, col_ptr, gold_ptr,
                    T, C, NB, DW, s_eb, s_et, s_em, s_el, s_g,
                    ORDER: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr, BC: tl.constexpr,
                    PER_POSITION: tl.constexpr, MOVES: tl.constexpr, MASKED: tl.constexpr = 0,
                    COLUMNS: tl.constexpr = 0, GOLD: tl.constexpr = 0, BT: tl.constexpr = 16):
    """The backward scan of one row: node marginals times ``grad[row]`` (``grad`` with stride
    ``s_g``) into ``d_em`` (zero-initialised; see :func:`_node_grad`), the start and end terms added
    into ``d_start``, ``d_end [N]`` (float64, zero-initialised, shared by the rows), and with
    ``MOVES`` the edge marginals: summed over positions and added into ``d_moves [N, C]`` (float64,
    zero-initialised) for shared transitions, per position into ``d_moves [B, T, N, C]``
    (zero-initialised) otherwise. With ``GOLD`` the gold path's counts (states ``gold [B, T]``
    from the forward kernel) are subtracted: the gradients of the NLL. ``MASKED`` (2): the
    positions ``pos`` the forward kernel wrote. Rows of length 0 and rows without a path (log Z =
    -inf) contribute zeros."""
    row, n, a, m, c, src, src_ok, dst, dst_ok, col, em_off, em_ok, em_row, w_off, w_ok = _prologue(
        len_ptr, mask_ptr, pos_ptr, col_ptr, em_ptr, T, C, NB, s_eb, s_em, s_el, BA, BB, BC, MASKED, COLUMNS, BT)
    N = NB * C
    dtype = alpha_ptr.dtype.element_ty
    log_z, live, steps, weight, last = _dead_or_alive(len_ptr, logz_ptr, grad_ptr, row, n, s_g, dtype)

    b = tl.load(end_ptr + dst, mask=dst_ok, other=NEG_INF).to(dtype)
    b_max = _max2(b)
    b = b - _finite_or_zero(b_max)
    beta_scale = b_max.to(tl.float64)
    alpha_scale = tl.load(scale_ptr + row * T + last, mask=live, other=0.0)
    x = tl.load(alpha_ptr + (row * T + last) * N + dst, mask=_both(dst_ok, live), other=NEG_INF)
    node = tl.exp(x + b + (alpha_scale + beta_scale - log_z).to(dtype))
    g = tl.full([], 0, tl.int32)
    if GOLD:
        g = tl.load(gold_ptr + row * T + last, mask=live, other=0)
    node = tl.where(live, node, 0.0) * weight
    count = _gold_count(dst, g, weight, GOLD)
    finite = tl.load(end_ptr + dst, mask=dst_ok, other=NEG_INF) > NEG_INF
    tl.atomic_add(d_end_ptr + dst, (node - tl.where(finite, count, 0.0)).to(tl.float64), mask=dst_ok)
    _node_grad(d_em_ptr, row, T, _at(pos_ptr, row, T, last, MASKED), DW, dst, col, node - count,
               _both(dst_ok, live), COLUMNS)
    moves = tl.load(moves_ptr + w_off, mask=w_ok, other=NEG_INF).to(dtype)
    total = tl.full((BA, BB, BC), 0, tl.float64)
    # what step t needs on its critical path is loaded during step t + 1
    e_next = tl.load(em_row + _at(pos_ptr, row, T, last, MASKED) * s_et + em_off, mask=_both(em_ok, steps > 1),
                     other=NEG_INF)
    scale_next = tl.load(scale_ptr + row * T + last - 1, mask=steps > 1, other=0.0)
    for i in range(1, steps):
        t = steps - i
        e = e_next.to(tl.float64)
        prev_scale = scale_next
        e_next = tl.load(em_row + _at(pos_ptr, row, T, t - 1, MASKED) * s_et + em_off, mask=_both(em_ok, t > 1),
                         other=NEG_INF)
        scale_next = tl.load(scale_ptr + row * T + t - 2, mask=t > 1, other=0.0)
        shift = alpha_scale - prev_scale  # what the forward scan took out of position t
        ahead = (e - shift).to(dtype) + b
        if PER_POSITION:
            moves = tl.load(moves_ptr + (row * T + t) * N * C + w_off, mask=w_ok, other=NEG_INF).to(dtype)
        s = moves + ahead[None, :, :]
        g_next = g
        if GOLD:
            g = tl.load(gold_ptr + row * T + t - 1)
        if MOVES:
            before = tl.load(alpha_ptr + (row * T + t - 1) * N + src, mask=src_ok, other=NEG_INF)
            edge = tl.exp(before[:, :, None] + s + (alpha_scale + beta_scale - log_z).to(dtype)) * weight
            if GOLD:
                taken = (src[:, :, None] == g) & (c[None, None, :] == g_next % C) & (moves > NEG_INF)
                edge -= tl.where(taken, weight, 0.0)
            if PER_POSITION:
                tl.store(d_moves_ptr + (row * T + t) * N * C + w_off, edge, mask=w_ok)
            else:
                total += edge.to(tl.float64)
        peak = _finite_or_zero(_max(s, 2))
        back = _relabel(peak + tl.log(_sum(tl.exp(s - peak[:, :, None]), 2)), BB, BC, 0, ORDER)
        b_max = _max2(back)
        b = back - _finite_or_zero(b_max)
        beta_scale = beta_scale + shift + b_max.to(tl.float64)
        alpha_scale = prev_scale
        x = tl.load(alpha_ptr + (row * T + t - 1) * N + dst, mask=dst_ok, other=NEG_INF)
        node = tl.exp(x + b + (alpha_scale + beta_scale - log_z).to(dtype)) * weight
        count = _gold_count(dst, g, weight, GOLD)
        _node_grad(d_em_ptr, row, T, _at(pos_ptr, row, T, t - 1, MASKED), DW, dst, col, node - count, dst_ok,
                   COLUMNS)
    finite = tl.load(start_ptr + dst, mask=dst_ok, other=NEG_INF) > NEG_INF
    tl.atomic_add(d_start_ptr + dst, (node - tl.where(finite, count, 0.0)).to(tl.float64), mask=dst_ok)
    if MOVES:
        if not PER_POSITION:
            tl.atomic_add(d_moves_ptr + w_off, total, mask=w_ok)


@triton.jit
def search_kernel(start_ptr, moves_ptr, end_ptr, em_ptr, len_ptr, pointer_ptr, states_ptr, scores_ptr,
                  mask_ptr, pos_ptr, col_ptr, label_ptr,
                  T, C, NB, K, s_eb, s_et, s_em, s_el,
                  ORDER: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                  PER_POSITION: tl.constexpr, MASKED: tl.constexpr = 0, COLUMNS: tl.constexpr = 0,
                  LABELS: tl.constexpr = 0, BT: tl.constexpr = 16):
    """The ``K`` best paths of one row (``K = 1``: Viterbi) in float64, back-pointers ``[B, T, N,
    K]`` (int32, ``source tag * K + rank``) and the backtrace: flat states (``LABELS``: their
    labels ``label [N]``) into ``states [B, K, T]`` (-1 elsewhere; at the original positions with
    ``MASKED``, see :func:`forward_kernel`) and scores into ``scores [B, K]``.

    Candidates for each destination are ranked by score, ties by ``source tag * K + rank`` (the
    order of the torch engine's stable sort); the last step ranks ``(state, rank)`` as the torch
    engine's two END steps do (order 2: by the pair's second tag first). A picked candidate is set
    to ``-inf``: once only ``-inf`` candidates are left, the picks (and their back-pointers) are
    arbitrary, which is harmless: no finite path leads through them, and missing paths come out as
    score ``-inf`` and states -1. Padding lanes (tags >= C, ranks >= K) are ``-inf`` throughout."""
    row, n, a, m, c, src, src_ok, dst, dst_ok, col, em_off, em_ok, em_row, w_off, w_ok = _prologue(
        len_ptr, mask_ptr, pos_ptr, col_ptr, em_ptr, T, C, NB, s_eb, s_em, s_el, BA, BB, BC, MASKED, COLUMNS, BT)
    N = NB * C
    r = tl.arange(0, BK)

    e = tl.load(em_row + _at(pos_ptr, row, T, 0, MASKED) * s_et + em_off, mask=_both(em_ok, n > 0),
                other=NEG_INF).to(tl.float64)
    first = tl.load(start_ptr + dst, mask=dst_ok, other=NEG_INF).to(tl.float64) + e
    score = tl.where(r[None, None, :] == 0, first[:, :, None], NEG_INF)  # [BB, BC, BK]
    moves = tl.load(moves_ptr + w_off, mask=w_ok, other=NEG_INF).to(tl.float64)
    key = a[:, None, None, None] * K + r[None, None, None, :]  # [BA, 1, 1, BK]
    pointer_off = dst[:, :, None] * K + r[None, None, :]
    pointer_ok = dst_ok[:, :, None] & (r[None, None, :] < K)
    e_next = tl.load(em_row + _at(pos_ptr, row, T, 1, MASKED) * s_et + em_off, mask=_both(em_ok, n > 1),
                     other=NEG_INF)
    moves_next = moves
    if PER_POSITION:
        moves_next = tl.load(moves_ptr + (row * T + 1) * N * C + w_off, mask=_both(w_ok, n > 1),
                             other=NEG_INF).to(tl.float64)
    for t in range(1, n):
        e = e_next.to(tl.float64)  # loaded one step ahead, as in the forward kernel
        e_next = tl.load(em_row + _at(pos_ptr, row, T, t + 1, MASKED) * s_et + em_off, mask=_both(em_ok, t + 1 < n),
                         other=NEG_INF)
        if PER_POSITION:
            moves = moves_next
            moves_next = tl.load(moves_ptr + (row * T + t + 1) * N * C + w_off, mask=_both(w_ok, t + 1 < n),
                                 other=NEG_INF).to(tl.float64)
        prev = _relabel(score, BA, BB, BK, ORDER)
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
    prev = _relabel(score, BA, BB, BK, ORDER)
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
    _backtrace(pointer_ptr, states_ptr, scores_ptr, pos_ptr, label_ptr, row, n, T, C, NB, K, r, best, state, rank,
               MASKED, LABELS, BK, BT)


@triton.jit
def _backtrace(pointer_ptr, states_ptr, scores_ptr, pos_ptr, label_ptr, row, n, T, C, NB, K, r, best, state, rank,
               MASKED: tl.constexpr, LABELS: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr):
    """Store the ranked final ``best [BK]`` scores and follow the back-pointers from the final
    ``state`` and ``rank`` of each path back to the first position: flat states (or their labels)
    into ``states [B, K, T]``, at the original positions with ``MASKED``, -1 everywhere else."""
    best = tl.where(n > 0, best, tl.where(r == 0, 0.0, NEG_INF))  # length 0: one empty path
    tl.store(scores_ptr + row * K + r, best, mask=r < K)
    N = NB * C
    out = states_ptr + (row * K + r) * T
    for t0 in range(0, T, BT):
        t = t0 + tl.arange(0, BT)
        tl.store(out[:, None] + t[None, :], tl.full((BK, BT), -1, tl.int64), mask=(r < K)[:, None] & (t < T)[None, :])
    tl.debug_barrier()  # the back-pointers and the fill of every thread of this program are written
    found = _both((best > NEG_INF) & (r < K), n > 0)
    _put(out, pos_ptr, label_ptr, row, T, n - 1, state, found, MASKED, LABELS)
    for i in range(1, n):
        t = n - i
        p = tl.load(pointer_ptr + ((row * T + t) * N + state) * K + rank, mask=found, other=0).to(tl.int64)
        state = (p // K) * NB + state // C
        rank = p % K
        _put(out, pos_ptr, label_ptr, row, T, t - 1, state, found, MASKED, LABELS)


@triton.jit
def _put(out, pos_ptr, label_ptr, row, T, t, state, found, MASKED: tl.constexpr, LABELS: tl.constexpr):
    """Store the paths' ``state`` (or its label) of compacted position ``t`` at its position."""
    value = state
    if LABELS:
        value = tl.load(label_ptr + state, mask=found, other=-1).to(tl.int64)
    tl.store(out + _at(pos_ptr, row, T, t, MASKED), value, mask=found)
