"""Blocked variants of the kernels of :mod:`.kernels`, for state spaces whose transition tile does
not fit one program's registers.

Same conventions, arguments and results as the single-tile kernels (flat states, the destination
layout ``(m, c)`` and the source layout ``(a, m)``), but the tiles are blocks: ``BB`` middle
components by ``BC`` last components of the destination layout, ``BA`` source components, and the
state vectors of the row live in a per-row scratch buffer ``work [B, 2, N]`` (ping-pong: step
``t`` reads half ``(t - 1) % 2`` and writes half ``t % 2``; ``[B, 2, N, K]`` for search) with one
``tl.debug_barrier()`` per position between the writes of a step and the reads of the next.

- forward: for each destination block, an online log-sum-exp over the source blocks (running
  peak and total per destination);
- backward: for each source block, an online log-sum-exp over the destination blocks gives the
  block's slice of the backward scores in source layout; they are read back in destination
  layout after the barrier. Edge marginals of shared transitions are added into the row's own
  ``d_moves`` region (zero-initialised, float64; one program per row, so no atomics);
- search: each source block's candidates are merged into the running top-``K`` of every
  destination: ``K`` picks over the union of the running list and the block, ranked by score,
  ties by ``source tag * K + rank`` (unique keys), which is the single-tile kernel's total order,
  so paths, scores and ties are the same.

Rescaling. A whole state vector is never in registers, so its maximum is known only once all its
blocks are written: the kernels store unshifted scores and subtract the maximum when they read
them at the next position (``scale`` and the backward shift account for it). As in the
single-tile kernels, log alpha_t = alpha_t + scale_t for the stored ``alpha [B, T, N]``.

The helpers of :mod:`.kernels` are reached through ``base``, the kernels module of the same mode
(interpreted or compiled), which :func:`.runtime.kernels` sets when it loads this module.
"""

from __future__ import annotations

from types import ModuleType

import triton
import triton.language as tl

base: ModuleType | None = None
NEG_INF = tl.constexpr(float("-inf"))
BIG_KEY = tl.constexpr(1 << 30)


@triton.jit
def _dest_block(mo, co, C, NB, BB: tl.constexpr, BC: tl.constexpr):
    """Destination block at ``(mo, co)``: indices ``m [BB]``, ``c [BC]``, flat states and mask ``[BB, BC]``."""
    m = mo + tl.arange(0, BB)
    c = co + tl.arange(0, BC)
    return m, c, m[:, None] * C + c[None, :], (m[:, None] < NB) & (c[None, :] < C)


@triton.jit
def _source_block(ao, m, C, NB, BA: tl.constexpr):
    """Source block of components ``ao + [0, BA)`` for the middle components ``m``: ``a [BA]``,
    flat states and mask ``[BA, BB]``."""
    a = ao + tl.arange(0, BA)
    return a, a[:, None] * NB + m[None, :], (a[:, None] < C) & (m[None, :] < NB)


@triton.jit
def _emissions(em_pos, col_ptr, m, c, ok, C, s_em, s_el, flag, COLUMNS: tl.constexpr):
    """Emissions ``[BB, BC]`` of a destination block at one position (``-inf`` outside ``ok``, for
    states without a column and unless ``flag``), in the emissions' dtype."""
    col = base._columns(col_ptr, c, C, COLUMNS)
    return tl.load(em_pos + m[:, None] * s_em + col[None, :] * s_el, mask=base._both(ok & (col[None, :] >= 0), flag),
                   other=NEG_INF)


@triton.jit
def _emission_peak(em_pos, col_ptr, C, NB, s_em, s_el, flag, dtype: tl.constexpr, BB: tl.constexpr,
                   BC: tl.constexpr, COLUMNS: tl.constexpr):
    """Largest emission of one position (0 if none is finite or ``flag`` is false)."""
    peak = tl.full([], NEG_INF, dtype)
    for mo in range(0, NB, BB):
        for co in range(0, C, BC):
            m, c, dst, ok = _dest_block(mo, co, C, NB, BB, BC)
            e = _emissions(em_pos, col_ptr, m, c, ok, C, s_em, s_el, flag, COLUMNS)
            peak = tl.maximum(peak, base._max2(e.to(dtype)))
    return base._finite_or_zero(peak)


@triton.jit
def _online(peak, total, s, axis: tl.constexpr):
    """Fold block scores ``s`` into a running log-sum-exp (``peak``, ``total``) along ``axis``."""
    grown = tl.maximum(peak, base._max(s, axis))
    safe = base._finite_or_zero(grown)
    total = total * tl.exp(peak - safe) + base._sum(tl.exp(s - tl.expand_dims(safe, axis)), axis)
    return grown, total


@triton.jit
def forward_blocked_kernel(start_ptr, moves_ptr, end_ptr, em_ptr, len_ptr, logz_ptr, alpha_ptr, scale_ptr,
                           mask_ptr, pos_ptr, col_ptr, tag_ptr, auto_ptr, gold_ptr, nll_ptr, norm_ptr,
                           work_ptr, T, C, NB, L, K, s_eb, s_et, s_em, s_el,
                           ORDER: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr, BC: tl.constexpr,
                           PER_POSITION: tl.constexpr, STORE: tl.constexpr, MASKED: tl.constexpr = 0,
                           COLUMNS: tl.constexpr = 0, GOLD: tl.constexpr = 0, NORMALIZE: tl.constexpr = 0,
                           BT: tl.constexpr = 16):
    """:func:`.kernels.forward_kernel` by blocks (``alpha`` holds unshifted scores; ``GOLD`` with
    shared transitions only)."""
    row, n = base._row_start(len_ptr, mask_ptr, pos_ptr, T, MASKED, BT)
    N = NB * C
    dtype = start_ptr.dtype.element_ty
    em_row = em_ptr + row * s_eb
    work = work_ptr + row * 2 * N

    em_pos = em_row + base._at(pos_ptr, row, T, 0, MASKED) * s_et
    e_max = _emission_peak(em_pos, col_ptr, C, NB, s_em, s_el, n > 0, dtype, BB, BC, COLUMNS)
    top = tl.full([], NEG_INF, dtype)
    for mo in range(0, NB, BB):
        for co in range(0, C, BC):
            m, c, dst, ok = _dest_block(mo, co, C, NB, BB, BC)
            e = _emissions(em_pos, col_ptr, m, c, ok, C, s_em, s_el, n > 0, COLUMNS)
            x = tl.load(start_ptr + dst, mask=ok, other=NEG_INF).to(dtype) + (e.to(dtype) - e_max)
            tl.store(work + dst, x, mask=ok)
            if STORE:
                tl.store(alpha_ptr + row * T * N + dst, x, mask=base._both(ok, n > 0))
            top = tl.maximum(top, base._max2(x))
    scale = e_max.to(tl.float64)
    if STORE:
        tl.store(scale_ptr + row * T, scale, mask=n > 0)
    shift = base._finite_or_zero(top)
    tl.debug_barrier()
    for t in range(1, n):
        before = work + ((t - 1) % 2) * N
        after = work + (t % 2) * N
        moves = moves_ptr
        if PER_POSITION:
            moves = moves_ptr + (row * T + t) * N * C
        em_pos = em_row + base._at(pos_ptr, row, T, t, MASKED) * s_et
        e_max = _emission_peak(em_pos, col_ptr, C, NB, s_em, s_el, True, dtype, BB, BC, COLUMNS)
        top = tl.full([], NEG_INF, dtype)
        for mo in range(0, NB, BB):
            for co in range(0, C, BC):
                m, c, dst, ok = _dest_block(mo, co, C, NB, BB, BC)
                peak = tl.full((BB, BC), NEG_INF, dtype)
                total = tl.full((BB, BC), 0.0, dtype)
                for ao in range(0, C, BA):
                    a, src, src_ok = _source_block(ao, m, C, NB, BA)
                    prev = tl.load(before + src, mask=src_ok, other=NEG_INF) - shift
                    w = tl.load(moves + src[:, :, None] * C + c[None, None, :],
                                mask=src_ok[:, :, None] & (c[None, None, :] < C), other=NEG_INF).to(dtype)
                    peak, total = _online(peak, total, prev[:, :, None] + w, 0)
                e = _emissions(em_pos, col_ptr, m, c, ok, C, s_em, s_el, True, COLUMNS).to(dtype)
                x = base._finite_or_zero(peak) + tl.log(total) + (e - e_max)
                tl.store(after + dst, x, mask=ok)
                if STORE:
                    tl.store(alpha_ptr + (row * T + t) * N + dst, x, mask=ok)
                top = tl.maximum(top, base._max2(x))
        scale = scale + shift.to(tl.float64) + e_max.to(tl.float64)
        if STORE:
            tl.store(scale_ptr + row * T + t, scale)
        shift = base._finite_or_zero(top)
        tl.debug_barrier()
    last = work + (tl.maximum(n - 1, 0) % 2) * N
    peak = tl.full((BB, BC), NEG_INF, dtype)
    total = tl.full((BB, BC), 0.0, dtype)
    for mo in range(0, NB, BB):
        for co in range(0, C, BC):
            m, c, dst, ok = _dest_block(mo, co, C, NB, BB, BC)
            z = (tl.load(last + dst, mask=base._both(ok, n > 0), other=NEG_INF) - shift
                 + tl.load(end_ptr + dst, mask=ok, other=NEG_INF).to(dtype))
            grown = tl.maximum(peak, z)
            safe = base._finite_or_zero(grown)
            total = total * tl.exp(peak - safe) + tl.exp(z - safe)
            peak = grown
    z_max = base._finite_or_zero(base._max2(peak))
    log_total = z_max + tl.log(base._sum(base._sum(total * tl.exp(peak - z_max), 1), 0))
    log_z = tl.where(n > 0, scale + shift.to(tl.float64) + log_total.to(tl.float64), 0.0)
    tl.store(logz_ptr + row, log_z)
    if GOLD:
        gold, bad = base._gold_path(start_ptr, moves_ptr, end_ptr, em_row, pos_ptr, col_ptr, tag_ptr, auto_ptr,
                                    gold_ptr, row, n, T, C, N, L, s_et, s_em, s_el, MASKED, COLUMNS, GOLD)
        base._finish_nll(nll_ptr, row, n, log_z, gold, bad)
    if NORMALIZE:
        base._normalize(norm_ptr, row, K, log_z)


@triton.jit
def _nodes(alpha_pos, beta, d_em_ptr, row, T, p, DW, col_ptr, start_ptr, end_ptr, d_start_ptr, d_end_ptr, bshift, const,
           weight, flag, first, at_end, g, C, NB, BB: tl.constexpr, BC: tl.constexpr, COLUMNS: tl.constexpr,
           GOLD: tl.constexpr):
    """Node marginals of one position, times ``weight`` (``GOLD``: less the gold state ``g``'s
    count), from the stored forward scores and the unshifted backward scores ``beta`` (flat), into
    ``d_em`` at original position ``p`` (see :func:`.kernels._node_grad`; nothing unless ``flag``),
    added into ``d_start`` where ``first`` and into ``d_end`` where ``at_end``."""
    for mo in range(0, NB, BB):
        for co in range(0, C, BC):
            m, c, dst, ok = _dest_block(mo, co, C, NB, BB, BC)
            x = tl.load(alpha_pos + dst, mask=base._both(ok, flag), other=NEG_INF)
            b = tl.load(beta + dst, mask=ok, other=NEG_INF) - bshift
            node = tl.where(flag, tl.exp(x + b + const), 0.0) * weight
            count = base._gold_count(dst, g, weight, GOLD)
            col = base._columns(col_ptr, c, C, COLUMNS)
            base._node_grad(d_em_ptr, row, T, p, DW, dst, col, node - count, base._both(ok, flag), COLUMNS)
            begin = tl.load(start_ptr + dst, mask=base._both(ok, first), other=NEG_INF) > NEG_INF
            tl.atomic_add(d_start_ptr + dst, (node - tl.where(begin, count, 0.0)).to(tl.float64),
                          mask=base._both(ok, first))
            close = tl.load(end_ptr + dst, mask=base._both(ok, at_end), other=NEG_INF) > NEG_INF
            tl.atomic_add(d_end_ptr + dst, (node - tl.where(close, count, 0.0)).to(tl.float64),
                          mask=base._both(ok, at_end))


@triton.jit
def backward_blocked_kernel(start_ptr, moves_ptr, end_ptr, em_ptr, len_ptr, logz_ptr, grad_ptr, alpha_ptr, scale_ptr,
                            d_em_ptr, d_start_ptr, d_end_ptr, d_moves_ptr, mask_ptr, pos_ptr, col_ptr, gold_ptr,
                            work_ptr, T, C, NB, DW, s_eb, s_et, s_em, s_el, s_g,
                            ORDER: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr, BC: tl.constexpr,
                            PER_POSITION: tl.constexpr, MOVES: tl.constexpr, MASKED: tl.constexpr = 0,
                            COLUMNS: tl.constexpr = 0, GOLD: tl.constexpr = 0, BT: tl.constexpr = 16):
    """:func:`.kernels.backward_kernel` by blocks (the edge marginals of shared transitions are
    added into ``d_moves`` position by position)."""
    row, n = base._row_start(len_ptr, mask_ptr, pos_ptr, T, MASKED, BT)
    N = NB * C
    dtype = alpha_ptr.dtype.element_ty
    em_row = em_ptr + row * s_eb
    work = work_ptr + row * 2 * N
    log_z, live, steps, weight, last = base._dead_or_alive(len_ptr, logz_ptr, grad_ptr, row, n, s_g, dtype)

    top = tl.full([], NEG_INF, dtype)
    for mo in range(0, NB, BB):
        for co in range(0, C, BC):
            m, c, dst, ok = _dest_block(mo, co, C, NB, BB, BC)
            b = tl.load(end_ptr + dst, mask=ok, other=NEG_INF).to(dtype)
            tl.store(work + (last % 2) * N + dst, b, mask=ok)
            top = tl.maximum(top, base._max2(b))
    bshift = base._finite_or_zero(top)
    beta_scale = tl.full([], 0.0, tl.float64)
    alpha_scale = tl.load(scale_ptr + row * T + last, mask=live, other=0.0)
    g = tl.full([], 0, tl.int32)
    if GOLD:
        g = tl.load(gold_ptr + row * T + last, mask=live, other=0)
    tl.debug_barrier()
    _nodes(alpha_ptr + (row * T + last) * N, work + (last % 2) * N, d_em_ptr, row, T,
           base._at(pos_ptr, row, T, last, MASKED), DW, col_ptr, start_ptr, end_ptr, d_start_ptr, d_end_ptr, bshift,
           (alpha_scale + bshift.to(tl.float64) - log_z).to(dtype), weight, live, last == 0, True, g, C, NB, BB, BC,
           COLUMNS, GOLD)
    for i in range(1, steps):
        t = steps - i
        ahead_half = work + (t % 2) * N
        back_half = work + ((t - 1) % 2) * N
        prev_scale = tl.load(scale_ptr + row * T + t - 1)
        shift = alpha_scale - prev_scale  # what the forward scan took out of position t
        beta_scale = beta_scale + bshift.to(tl.float64)
        const = (alpha_scale + beta_scale - log_z).to(dtype)
        em_pos = em_row + base._at(pos_ptr, row, T, t, MASKED) * s_et
        moves = moves_ptr
        if PER_POSITION:
            moves = moves_ptr + (row * T + t) * N * C
        g_next = g
        if GOLD:
            g = tl.load(gold_ptr + row * T + t - 1)
        top = tl.full([], NEG_INF, dtype)
        for mo in range(0, NB, BB):
            m = mo + tl.arange(0, BB)
            for ao in range(0, C, BA):
                a, src, src_ok = _source_block(ao, m, C, NB, BA)
                if MOVES:
                    before = tl.load(alpha_ptr + (row * T + t - 1) * N + src, mask=src_ok, other=NEG_INF)
                peak = tl.full((BA, BB), NEG_INF, dtype)
                total = tl.full((BA, BB), 0.0, dtype)
                for co in range(0, C, BC):
                    _, c, dst, ok = _dest_block(mo, co, C, NB, BB, BC)
                    e = _emissions(em_pos, col_ptr, m, c, ok, C, s_em, s_el, True, COLUMNS)
                    b = tl.load(ahead_half + dst, mask=ok, other=NEG_INF) - bshift
                    ahead = (e.to(tl.float64) - shift).to(dtype) + b
                    w_off = src[:, :, None] * C + c[None, None, :]
                    w_ok = src_ok[:, :, None] & (c[None, None, :] < C)
                    w = tl.load(moves + w_off, mask=w_ok, other=NEG_INF).to(dtype)
                    s = w + ahead[None, :, :]
                    if MOVES:
                        edge = tl.exp(before[:, :, None] + s + const) * weight
                        if GOLD:
                            taken = (src[:, :, None] == g) & (c[None, None, :] == g_next % C) & (w > NEG_INF)
                            edge -= tl.where(taken, weight, 0.0)
                        if PER_POSITION:
                            tl.store(d_moves_ptr + (row * T + t) * N * C + w_off, edge, mask=w_ok)
                        else:
                            tl.atomic_add(d_moves_ptr + w_off, edge.to(tl.float64), mask=w_ok)
                    peak, total = _online(peak, total, s, 2)
                back = base._finite_or_zero(peak) + tl.log(total)
                tl.store(back_half + src, back, mask=src_ok)
                top = tl.maximum(top, base._max2(back))
        tl.debug_barrier()
        beta_scale = beta_scale + shift
        bshift = base._finite_or_zero(top)
        alpha_scale = prev_scale
        _nodes(alpha_ptr + (row * T + t - 1) * N, back_half, d_em_ptr, row, T, base._at(pos_ptr, row, T, t - 1, MASKED),
               DW, col_ptr, start_ptr, end_ptr, d_start_ptr, d_end_ptr, bshift,
               (alpha_scale + beta_scale + bshift.to(tl.float64) - log_z).to(dtype), weight, True, t == 1, False, g,
               C, NB, BB, BC, COLUMNS, GOLD)


@triton.jit
def _merge(best, pointer, cand, key, K, BK: tl.constexpr):
    """The ``K`` best of a running list ``best``/``pointer [BB, BC, BK]`` and a block of candidates
    ``cand [BA, BB, BC, BK]`` with keys ``key [BA, 1, 1, BK]``: by score, ties by the smaller key."""
    r = tl.arange(0, BK)[None, None, :]
    merged = tl.full(best.shape, NEG_INF, tl.float64)
    keys = tl.full(pointer.shape, BIG_KEY, tl.int32)
    for j in range(0, K):
        top = tl.maximum(base._max(base._max(cand, 3), 0), base._max(best, 2))  # [BB, BC]
        pick = tl.minimum(base._min(base._min(tl.where(cand == top[None, :, :, None], key, BIG_KEY), 3), 0),
                          base._min(tl.where(best == top[:, :, None], pointer, BIG_KEY), 2))
        cand = tl.where(key == pick[None, :, :, None], NEG_INF, cand)  # taken
        best = tl.where(pointer == pick[:, :, None], NEG_INF, best)
        merged = tl.where(r == j, top[:, :, None], merged)
        keys = tl.where(r == j, pick[:, :, None], keys)
    return merged, keys


@triton.jit
def _merge_final(best, chosen, final, key, K, BK: tl.constexpr):
    """The ``K`` best of a running list ``best``/``chosen [BK]`` and a block ``final [BA, BB, BK]``
    with keys ``key`` of the same shape (the END step)."""
    r = tl.arange(0, BK)
    merged = tl.full((BK,), NEG_INF, tl.float64)
    keys = tl.full((BK,), BIG_KEY, tl.int32)
    for j in range(0, K):
        top = tl.maximum(base._max(base._max(base._max(final, 2), 1), 0), base._max(best, 0))
        pick = tl.minimum(base._min(base._min(base._min(tl.where(final == top, key, BIG_KEY), 2), 1), 0),
                          base._min(tl.where(best == top, chosen, BIG_KEY), 0))
        final = tl.where(key == pick, NEG_INF, final)
        best = tl.where(chosen == pick, NEG_INF, best)
        merged = tl.where(r == j, top, merged)
        keys = tl.where(r == j, pick, keys)
    return merged, keys


@triton.jit
def search_blocked_kernel(start_ptr, moves_ptr, end_ptr, em_ptr, len_ptr, pointer_ptr, states_ptr, scores_ptr,
                          mask_ptr, pos_ptr, col_ptr, label_ptr,
                          work_ptr, T, C, NB, K, s_eb, s_et, s_em, s_el,
                          ORDER: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr, BC: tl.constexpr,
                          BK: tl.constexpr, PER_POSITION: tl.constexpr, MASKED: tl.constexpr = 0,
                          COLUMNS: tl.constexpr = 0, LABELS: tl.constexpr = 0, BT: tl.constexpr = 16):
    """:func:`.kernels.search_kernel` by blocks; ``work [B, 2, N, K]`` float64."""
    row, n = base._row_start(len_ptr, mask_ptr, pos_ptr, T, MASKED, BT)
    N = NB * C
    r = tl.arange(0, BK)
    em_row = em_ptr + row * s_eb
    work = work_ptr + row * 2 * N * K

    for mo in range(0, NB, BB):
        for co in range(0, C, BC):
            m, c, dst, ok = _dest_block(mo, co, C, NB, BB, BC)
            e = _emissions(em_row + base._at(pos_ptr, row, T, 0, MASKED) * s_et, col_ptr, m, c, ok, C, s_em, s_el,
                           n > 0, COLUMNS)
            first = tl.load(start_ptr + dst, mask=ok, other=NEG_INF).to(tl.float64) + e.to(tl.float64)
            score = tl.where(r[None, None, :] == 0, first[:, :, None], NEG_INF)
            tl.store(work + dst[:, :, None] * K + r[None, None, :], score, mask=ok[:, :, None] & (r < K)[None, None, :])
    tl.debug_barrier()
    for t in range(1, n):
        before = work + ((t - 1) % 2) * N * K
        after = work + (t % 2) * N * K
        moves = moves_ptr
        if PER_POSITION:
            moves = moves_ptr + (row * T + t) * N * C
        for mo in range(0, NB, BB):
            for co in range(0, C, BC):
                m, c, dst, ok = _dest_block(mo, co, C, NB, BB, BC)
                best = tl.full((BB, BC, BK), NEG_INF, tl.float64)
                pointer = tl.full((BB, BC, BK), BIG_KEY, tl.int32)
                for ao in range(0, C, BA):
                    a, src, src_ok = _source_block(ao, m, C, NB, BA)
                    prev = tl.load(before + src[:, :, None] * K + r[None, None, :],
                                   mask=src_ok[:, :, None] & (r < K)[None, None, :], other=NEG_INF)
                    w = tl.load(moves + src[:, :, None] * C + c[None, None, :],
                                mask=src_ok[:, :, None] & (c[None, None, :] < C), other=NEG_INF).to(tl.float64)
                    key = a[:, None, None, None] * K + r[None, None, None, :]
                    best, pointer = _merge(best, pointer, prev[:, :, None, :] + w[:, :, :, None], key, K, BK)
                e = _emissions(em_row + base._at(pos_ptr, row, T, t, MASKED) * s_et, col_ptr, m, c, ok, C, s_em, s_el,
                               True, COLUMNS)
                out = dst[:, :, None] * K + r[None, None, :]
                out_ok = ok[:, :, None] & (r < K)[None, None, :]
                tl.store(after + out, best + e.to(tl.float64)[:, :, None], mask=out_ok)
                tl.store(pointer_ptr + (row * T + t) * N * K + out, pointer, mask=out_ok)
        tl.debug_barrier()

    # the move to END: rank (state, rank) pairs by score, ties by (second tag, first tag, rank)
    last = work + (tl.maximum(n - 1, 0) % 2) * N * K
    best = tl.full((BK,), NEG_INF, tl.float64)
    chosen = tl.full((BK,), BIG_KEY, tl.int32)
    for mo in range(0, NB, BB):
        m = mo + tl.arange(0, BB)
        for ao in range(0, C, BA):
            a, src, src_ok = _source_block(ao, m, C, NB, BA)
            prev = tl.load(last + src[:, :, None] * K + r[None, None, :],
                           mask=base._both(src_ok[:, :, None] & (r < K)[None, None, :], n > 0), other=NEG_INF)
            final = prev + tl.load(end_ptr + src, mask=src_ok, other=NEG_INF).to(tl.float64)[:, :, None]
            key = m[None, :, None] * (C * K) + a[:, None, None] * K + r[None, None, :]
            best, chosen = _merge_final(best, chosen, final, key, K, BK)
    pick = chosen.to(tl.int64)
    state = ((pick % (C * K)) // K) * NB + pick // (C * K)
    rank = pick % K
    base._backtrace(pointer_ptr, states_ptr, scores_ptr, pos_ptr, label_ptr, row, n, T, C, NB, K, r, best, state,
                    rank, MASKED, LABELS, BK, BT)
