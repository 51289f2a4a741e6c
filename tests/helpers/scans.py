"""The torch backend's exp-space scan against its log-space scan."""

from __future__ import annotations

import torch

from neurocrf.structs import engine
from neurocrf.structs.engine.pytorch import exp_scan
from neurocrf.structs.engine.pytorch import first_order as fast_first_order


def assert_exp_scan_equals_log_scan(monkeypatch, crf, emissions, mask, budget: float) -> None:
    """Log Z, every gradient and the marginals: exp-space kernel at ``budget`` = log-space kernel
    (the torch backend's general chain engine: the first-order fast path, tested in
    test_structs_fast.py, is off)."""
    monkeypatch.setenv(engine.ENV, "torch")
    monkeypatch.setattr(fast_first_order, "applies", lambda *args: False)
    gold = crf.decode(emissions, mask).clamp(min=0)
    results = {}
    for name, limit in (("exp", budget), ("log", -1.0)):
        monkeypatch.setattr(exp_scan, "_BLOCK_BUDGET", limit)
        crf.zero_grad()
        leaf = emissions.clone().requires_grad_(True)
        crf(leaf, gold, mask, reduction="sum").backward()
        results[name] = [crf.log_partition(emissions, mask), leaf.grad, crf.marginals(emissions, mask),
                         *[p.grad.clone() for p in crf.parameters()]]
    for a, b in zip(results["exp"], results["log"]):
        torch.testing.assert_close(a, b)

