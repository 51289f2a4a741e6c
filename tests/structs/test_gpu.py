"""CRF layers on CUDA give the CPU results (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from neurocrf.structs import build_crf

pytestmark = pytest.mark.gpu
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


@pytest.mark.parametrize("kind", ["first_order", "second_order", "precursor"])
def test_cuda_matches_cpu(kind):
    torch.manual_seed(0)
    crf = build_crf(kind, TAGS, "IOB2")
    emissions = torch.randn(6, 23, len(TAGS)) * 3
    mask = torch.rand(6, 23) < 0.85
    tags = crf.decode(emissions, mask).clamp(min=0)
    gpu = build_crf(kind, TAGS, "IOB2").cuda()
    gpu.load_state_dict(crf.state_dict())
    on_gpu = emissions.cuda().requires_grad_(True)
    loss = gpu(on_gpu, tags.cuda(), mask.cuda(), reduction="sum")
    loss.backward()
    on_cpu = emissions.clone().requires_grad_(True)
    crf(on_cpu, tags, mask, reduction="sum").backward()
    torch.testing.assert_close(loss.cpu(), crf(emissions, tags, mask, reduction="sum"), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(on_gpu.grad.cpu(), on_cpu.grad, rtol=1e-4, atol=1e-5)
    assert gpu.decode(on_gpu.detach(), mask.cuda()).cpu().tolist() == crf.decode(emissions, mask).tolist()
    torch.testing.assert_close(gpu.marginals(on_gpu.detach(), mask.cuda()).cpu(), crf.marginals(emissions, mask),
                               rtol=1e-4, atol=1e-5)
    paths, scores = gpu.nbest(on_gpu.detach(), mask.cuda(), k=4)
    cpu_paths, cpu_scores = crf.nbest(emissions, mask, k=4)
    torch.testing.assert_close(scores.cpu(), cpu_scores, rtol=1e-4, atol=1e-4)


def test_cuda_parallel_scan_for_long_sequences():
    torch.manual_seed(1)
    crf = build_crf("first_order", TAGS, "IOB2", parallel_threshold=64).cuda()
    emissions = torch.randn(4, 700, len(TAGS), device="cuda")
    parallel = crf.log_partition(emissions)
    crf.scan = "sequential"
    torch.testing.assert_close(parallel, crf.log_partition(emissions), rtol=1e-5, atol=1e-3)


def test_bf16_autocast_on_cuda():
    crf = build_crf("first_order", TAGS, "IOB2").cuda()
    emissions = torch.randn(3, 9, len(TAGS), device="cuda")
    tags = crf.decode(emissions).clamp(min=0)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = crf(emissions.bfloat16(), tags)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


def test_cuda_pair_emissions_match_cpu():
    """Observation-dependent transitions on the GPU kernel (blocks of positions) = the CPU result."""
    torch.manual_seed(2)
    crf = build_crf("first_order", TAGS, "IOB2").double()
    pairs = torch.randn(4, 37, len(TAGS) + 1, len(TAGS), dtype=torch.float64)
    mask = torch.rand(4, 37) < 0.9
    gpu = build_crf("first_order", TAGS, "IOB2").double().cuda()
    gpu.load_state_dict(crf.state_dict())
    on_gpu = pairs.cuda().requires_grad_(True)
    gpu.log_partition(on_gpu, mask.cuda()).sum().backward()
    on_cpu = pairs.clone().requires_grad_(True)
    crf.log_partition(on_cpu, mask).sum().backward()
    torch.testing.assert_close(on_gpu.grad.cpu(), on_cpu.grad)
    torch.testing.assert_close(gpu.marginals(pairs.cuda(), mask.cuda()).cpu(), crf.marginals(pairs, mask))
    assert gpu.decode(pairs.cuda(), mask.cuda()).cpu().tolist() == crf.decode(pairs, mask).tolist()
