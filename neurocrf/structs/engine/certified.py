"""What the certified scans of the torch and compiled backends share: log Z as an autograd node.

Both backends run rescaled forward-backward scans in float64 probability space on CPU and certify
afterwards that no value underflowed or overflowed (the torch backend's
:class:`~neurocrf.structs.engine.pytorch.first_order.ForwardBackward` and
:class:`~neurocrf.structs.engine.pytorch.pairs.PairForwardBackward`, the compiled backend's
:class:`~neurocrf.structs.engine.compiled.scan.KernelForwardBackward`). A certified scan is an
object with ``log_z`` (``[B]`` float64) and ``gradients(grad_log_z, need_moves)``, which returns
the gradients of ``sum_b grad_log_z[b] log Z[b]`` for start, transitions, end and emissions, or
None when its backward scan cannot be certified. :class:`CertifiedLogPartition` turns such a scan
into a differentiable log partition with a fallback for what the scan cannot do.
"""

from __future__ import annotations

import torch

DROPPED_ERROR = 2.0 ** -60
"""Largest relative error of ``Z`` that values a forward scan dropped at a rescaling may cause (a
bound the backward pass computes); below float64's rounding of the result."""


class CertifiedLogPartition(torch.autograd.Function):
    """``apply(start, transitions, end, emissions, scan, fallback)`` -> ``[B]`` log Z of a certified
    ``scan`` (see the module docstring), in the emissions' dtype, with the scan's forward-backward
    gradient.

    ``fallback(start, transitions, end, emissions)`` must compute the same log partition
    differentiably: the gradient comes from it when the scan's backward pass is not certified, and
    double backward (``create_graph=True``) differentiates through it, so second derivatives are
    whatever the fallback guarantees (the reference's log-space scan: every order).
    """

    @staticmethod
    def forward(ctx, start, transitions, end, emissions, scan, fallback):  # type: ignore[override]
        ctx.scan, ctx.fallback = scan, fallback
        ctx.save_for_backward(start, transitions, end, emissions)
        return scan.log_z.to(emissions.dtype)

    @staticmethod
    def backward(ctx, grad_log_z):  # type: ignore[override]
        inputs = ctx.saved_tensors
        needed = ctx.needs_input_grad[:4]
        grads = None
        if not torch.is_grad_enabled():
            with torch.no_grad():
                grads = ctx.scan.gradients(grad_log_z, needed[1] or needed[2])
        if grads is None:
            with torch.enable_grad():
                chosen = [x for x, need in zip(inputs, needed) if need]
                log_z = ctx.fallback(*inputs)
                grads = iter(torch.autograd.grad(log_z, chosen, grad_log_z, create_graph=torch.is_grad_enabled(),
                                                 allow_unused=True))
            out = [next(grads) if need else None for need in needed]
        else:
            out = [None if g is None or not need else g.to(x.dtype) for g, need, x in zip(grads, needed, inputs)]
        return (*out, None, None)
