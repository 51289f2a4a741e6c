"""The CRF calls on a GPU: captured in a CUDA graph and replayed, under ``torch.compile(mode=
"reduce-overhead")``, kernel launches counted by the profiler, and timed per call.

For each layer (first order, precursor, second order; see :mod:`tools.gpu_calls`) and call (NLL
forward + backward, Viterbi, k best): the call is captured once in a CUDA graph and replayed on new
emissions, and the replay must give what an eager call gives (loss, gradients of the emissions and
the parameters, paths); the same under ``torch.compile(mode="reduce-overhead")``; the profiler
counts the device kernels one eager call launches; CUDA events time eager calls and replays.
Prints Markdown; exits 1 when a replay or a compiled call differs from eager.

    python -m tools.gpu_capture                       # CUDA, 32 x 40 and the goal sizes
    python -m tools.gpu_capture --device cpu          # the CPU-able parts: compile, profiler counts
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch

from tools.gpu_calls import calls, inputs, layers

GOAL_SIZES = ((32, 40, 9), (256, 128, 17), (64, 1024, 9))
"""The sizes of the GPU goals (first order): NLL forward + backward and Viterbi per call."""


def _results(layer: torch.nn.Module, name: str, emissions: torch.Tensor, run: Callable[[], object]) -> list:
    """What a call produced, as tensors to compare: its output, the emissions' and the
    parameters' gradients (NLL)."""
    out = run()
    if name == "nll":
        return [out.detach().clone(), emissions.grad.clone()] + [p.grad.clone() for p in layer.parameters()]
    return [x.clone() for x in (out if isinstance(out, tuple) else (out,))]


def _call(layer, name: str, emissions: torch.Tensor, mask, tags, k: int = 4) -> Callable[[], object]:
    """A call on the fixed tensor ``emissions`` (a leaf for the NLL, whose gradients it sets)."""
    if name == "nll":
        def nll():
            layer.zero_grad(set_to_none=True)
            emissions.grad = None
            loss = layer(emissions, tags, mask)
            loss.backward()
            return loss
        return nll
    if name == "viterbi":
        return lambda: layer.decode(emissions, mask)
    return lambda: layer.nbest(emissions, mask, k=k)


def _same(mine: list, theirs: list) -> str:
    for a, b in zip(mine, theirs):
        if a.dtype.is_floating_point:
            if not torch.allclose(a, b, rtol=1e-5, atol=1e-5, equal_nan=True):
                return f"differs by {(a - b).abs().nan_to_num().max().item():.3g}"
        elif not torch.equal(a, b):
            return "paths differ"
    return "same as eager"


def capture(layer, name: str, emissions, mask, tags) -> str:
    """Capture the call in a CUDA graph, replay it on new emissions, compare with eager."""
    static = emissions.detach().clone().requires_grad_(name == "nll")
    run = _call(layer, name, static, mask, tags)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.set_grad_enabled(name == "nll"):
        for _ in range(3):  # first use (self-check, compilation) and allocator warm-up off the graph
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    layer.zero_grad(set_to_none=True)
    static.grad = None
    with torch.cuda.graph(graph), torch.set_grad_enabled(name == "nll"):
        if name == "nll":
            out = layer(static, tags, mask)
            out.backward()
        else:
            out = run()
    fresh = torch.randn_like(emissions)
    with torch.no_grad():
        static.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    if name == "nll":
        replayed = [out.detach().clone(), static.grad.clone()] + [p.grad.clone() for p in layer.parameters()]
    else:
        replayed = [x.clone() for x in (out if isinstance(out, tuple) else (out,))]
    leaf = fresh.clone().requires_grad_(name == "nll")
    with torch.set_grad_enabled(name == "nll"):
        eager = _results(layer, name, leaf, _call(layer, name, leaf, mask, tags))
    return _same(replayed, eager)


def compiled(layer, name: str, emissions, mask, tags, device: str) -> str:
    """The call inside ``torch.compile(mode="reduce-overhead")`` (the CRF call itself runs outside
    the compiled graphs: its methods are ``torch.compiler.disable``-d), compared with eager."""
    leaf = emissions.detach().clone().requires_grad_(name == "nll")
    function = torch.compile(_call(layer, name, leaf, mask, tags), mode="reduce-overhead" if device == "cuda"
                             else "default")
    with torch.set_grad_enabled(name == "nll"):
        for _ in range(3):
            function()
        mine = _results(layer, name, leaf, function)
        other = leaf.detach().clone().requires_grad_(name == "nll")
        eager = _results(layer, name, other, _call(layer, name, other, mask, tags))
    return _same(mine, eager)


def launches(layer, name: str, emissions, mask, tags, device: str) -> int:
    """Device kernels (CPU: aten ops) one eager call launches, counted by the profiler."""
    leaf = emissions.detach().clone().requires_grad_(name == "nll")
    run = _call(layer, name, leaf, mask, tags)
    with torch.set_grad_enabled(name == "nll"):
        run()
        activities = [torch.profiler.ProfilerActivity.CUDA if device == "cuda" else torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities) as profile:
            run()
            if device == "cuda":
                torch.cuda.synchronize()
    kind = torch.autograd.DeviceType.CUDA if device == "cuda" else torch.autograd.DeviceType.CPU
    events = [e for e in profile.events() if e.device_type == kind]
    if device != "cuda":
        events = [e for e in events if e.name.startswith("aten::") and e.cpu_parent is None]
    return len(events)


def timing(layer, name: str, emissions, mask, tags, repeats: int = 50) -> tuple[float, float | None]:
    """Milliseconds per call: eager, and replayed from a CUDA graph (None on CPU)."""
    leaf = emissions.detach().clone().requires_grad_(name == "nll")
    run = _call(layer, name, leaf, mask, tags)
    cuda = emissions.is_cuda
    with torch.set_grad_enabled(name == "nll"):
        for _ in range(3):
            run()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        if cuda:
            torch.cuda.synchronize()
        eager = (time.perf_counter() - start) / repeats * 1e3
    if not cuda:
        return eager, None
    graph = torch.cuda.CUDAGraph()
    layer.zero_grad(set_to_none=True)
    leaf.grad = None
    with torch.cuda.graph(graph), torch.set_grad_enabled(name == "nll"):
        run()
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        graph.replay()
    torch.cuda.synchronize()
    return eager, (time.perf_counter() - start) / repeats * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=40)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (its first call compiles)")
    parser.add_argument("--no-goals", action="store_true", help="skip the timings at the goal sizes")
    args = parser.parse_args(argv)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    failed = False
    print(f"## CRF calls on {device} at {args.batch} x {args.seq_len} (backend auto)\n")
    print("| layer | call | launches (profiler) | CUDA graph replay | torch.compile | eager ms | replay ms |")
    print("|---|---|---|---|---|---|---|")
    for kind, layer in layers(device, backend="auto").items():
        emissions, mask, tags = inputs(layer, args.batch, args.seq_len, device)
        for name in calls(layer, emissions, mask, tags):
            graph = capture(layer, name, emissions, mask, tags) if device == "cuda" else "n/a (CPU)"
            compile_result = "skipped" if args.no_compile else compiled(layer, name, emissions, mask, tags, device)
            eager, replay = timing(layer, name, emissions, mask, tags)
            failed |= any(r not in ("same as eager", "n/a (CPU)", "skipped") for r in (graph, compile_result))
            print(f"| {kind} | {name} | {launches(layer, name, emissions, mask, tags, device)} | {graph} | "
                  f"{compile_result} | {eager:.3f} | {'-' if replay is None else f'{replay:.3f}'} |", flush=True)
    if not args.no_goals and device == "cuda":
        print("\n## First order at the goal sizes (ms per call; goal: NLL fwd+bwd and Viterbi <= 0.1 / 0.15 / 0.5)\n")
        print("| B x T x L | NLL eager | NLL replay | Viterbi eager | Viterbi replay |")
        print("|---|---|---|---|---|")
        for batch, seq_len, tags_count in GOAL_SIZES:
            layer = layers(device, backend="auto", num_tags=tags_count)["first order"]
            emissions, mask, tags = inputs(layer, batch, seq_len, device)
            cells = []
            for name in ("nll", "viterbi"):
                eager, replay = timing(layer, name, emissions, mask, tags)
                cells += [f"{eager:.3f}", f"{replay:.3f}"]
            print(f"| {batch} x {seq_len} x {tags_count} | " + " | ".join(cells) + " |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
