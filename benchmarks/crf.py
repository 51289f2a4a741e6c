"""Benchmark neurocrf's CRF layers against pytorch-crf and torch-struct, in one process.

Every contender runs once per round, in rotating order, for ``--repeats`` rounds; the table gives
medians and the ratios between contenders measured in the same rounds. Memory is the number of
bytes autograd saves for the backward pass of the NLL (on CUDA also the peak allocated memory).
The neurocrf layers run once per engine backend (``--backends``; default: torch and, where
available, the device's fast backend: the compiled kernel on CPU, triton on CUDA).
``--clock thread`` times CPU time of the calling thread instead of wall time: on a machine shared
with other jobs it leaves out the time the process waits for a core. On glibc the script fixes
malloc's thresholds first (``--no-pin-malloc`` to keep glibc's defaults): blocks up to 32 MiB come
from the heap, and the heap is never given back to the system. Otherwise torch-struct's frees of
hundreds of MB change the dynamic thresholds under the other contenders, whose buffers of a few
hundred KB then pay page faults on every call (measured: neurocrf's pure-torch first-order NLL at
32x40x17 took 2.4x its time alone, pytorch-crf's 1.1x).

    python -m benchmarks.crf --threads 1 --out bench_crf_cpu.md
    python -m benchmarks.crf --device cuda --backends torch,triton   # one column per backend
    python -m benchmarks.crf --sizes 64x128x45 --skip second-order   # one size, no second order
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import platform
import time
from typing import Callable

import torch

from benchmarks.common import iob2_tags, time_interleaved
from neurocrf.structs import LinearChainCRF, PrecursorInducedCRF, SecondOrderCRF, engine

CPU_SIZES = [(32, 40, 9), (32, 40, 17), (128, 40, 9), (8, 256, 9)]
CUDA_SIZES = CPU_SIZES + [(256, 128, 17), (64, 1024, 9)]


def saved_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """Bytes of tensors autograd keeps for the backward pass of ``fn()``."""
    total = 0
    seen: set[int] = set()

    def pack(t: torch.Tensor):
        nonlocal total
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn()
    loss.backward()
    return total


def peak_cuda_bytes(fn: Callable[[], None], device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(device) - base


def layer_name(kind: str, backend: str) -> str:
    """Contender name of a neurocrf layer (``kind``: first-order, second-order, precursor)."""
    return f"neurocrf {kind} [{backend}]"


def default_backends(device: torch.device) -> list[str]:
    """torch, and the device's fast backend where it is available (compiled on CPU, triton on CUDA)."""
    fast = "triton" if device.type == "cuda" else "compiled"
    return ["torch", fast] if engine.describe()[fast] == "available" else ["torch"]


def make_layers(num_tags: int, device: torch.device, backends: list[str], constrained: bool = False
                ) -> dict[str, torch.nn.Module]:
    """The three layers once per backend; every backend's layer shares the first one's parameters,
    so all compute the same (``constrained``: the precursor layer forbids invalid IOB2 moves)."""
    layers: dict[str, torch.nn.Module] = {}
    probe = torch.zeros(1, 2, num_tags, device=device)
    for backend in backends:
        built = {
            "first-order": LinearChainCRF(num_tags, backend=backend),
            "second-order": SecondOrderCRF(num_tags, backend=backend),
            "precursor": PrecursorInducedCRF(iob2_tags(num_tags), "IOB2", constrained=constrained,
                                              backend=backend),
        }
        for kind, layer in built.items():
            try:  # a backend that does not take this layer's state space is left out, and said so
                layer.to(device).log_partition(probe)
            except engine.BackendError as error:
                print(f"{layer_name(kind, backend)}: left out ({error})")
                continue
            first = layers.get(layer_name(kind, backends[0]))
            if first is not None:
                layer.load_state_dict(first.state_dict())
            layers[layer_name(kind, backend)] = layer.to(device)
    return layers


def build_contenders(batch: int, seq_len: int, num_tags: int, device: torch.device, with_peers: bool,
                     backends: list[str], constrained: bool = False):
    torch.manual_seed(0)
    emissions = torch.randn(batch, seq_len, num_tags, device=device, requires_grad=True)
    tags = torch.randint(num_tags, (batch, seq_len), device=device)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (batch,), device=device)
    lengths[0] = seq_len
    mask = torch.arange(seq_len, device=device) < lengths[:, None]
    layers = make_layers(num_tags, device, backends, constrained)
    ours = layers[layer_name("first-order", backends[0])]
    nll: dict[str, Callable[[], torch.Tensor]] = {
        name: (lambda layer=layer: layer(emissions, tags, mask)) for name, layer in layers.items()
    }
    viterbi: dict[str, Callable[[], object]] = {
        name: (lambda layer=layer: layer.decode(emissions.detach(), mask)) for name, layer in layers.items()
    }
    if with_peers:
        try:
            import torchcrf

            peer = torchcrf.CRF(num_tags, batch_first=True).to(device)
            nll["pytorch-crf"] = lambda: -peer(emissions, tags, mask, reduction="mean")
            viterbi["pytorch-crf"] = lambda: peer.decode(emissions.detach(), mask)
        except ImportError:
            print("pytorch-crf not installed: skipped")
        try:
            import warnings

            import torch_struct

            warnings.filterwarnings("ignore", module="torch_struct")

            def struct_potentials(e: torch.Tensor) -> torch.Tensor:
                edges = ours.transitions.t() + e[:, 1:, :, None]
                first = (ours.start_transitions + e[:, 0])[:, None, :]
                return torch.cat([edges[:, :1] + first.unsqueeze(1), edges[:, 1:]], dim=1)

            def struct_nll() -> torch.Tensor:
                dist = torch_struct.LinearChainCRF(struct_potentials(emissions), lengths=lengths)
                return -dist.log_prob(dist.to_event(tags, num_tags, lengths=lengths)).mean()

            def struct_viterbi():
                with torch.no_grad():
                    return torch_struct.LinearChainCRF(struct_potentials(emissions), lengths=lengths).argmax

            nll["torch-struct"] = struct_nll
            viterbi["torch-struct"] = struct_viterbi
        except ImportError:
            print("torch-struct not installed: skipped")
    return emissions, nll, viterbi


def pin_malloc_thresholds() -> bool:
    """Fix glibc's mmap threshold (32 MiB, its largest) and trim threshold (none); False where not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, -1))


def run(sizes, device: torch.device, repeats: int, with_peers: bool, backends: list[str],
        skip: list[str] = (), constrained: bool = False, clock: Callable[[], float] = time.perf_counter) -> list[dict]:
    rows = []
    for batch, seq_len, num_tags in sizes:
        emissions, nll, viterbi = build_contenders(batch, seq_len, num_tags, device, with_peers, backends,
                                                   constrained)
        for table in (nll, viterbi):
            for name in [name for name in table if any(part in name for part in skip)]:
                del table[name]
        slow = batch * seq_len * num_tags * num_tags > 2_000_000 and device.type == "cpu"
        reps = max(5, repeats // 4) if slow else repeats

        def train_step(fn):
            def step():
                emissions.grad = None
                fn().backward()
            return step

        nll_times = time_interleaved({n: train_step(f) for n, f in nll.items()}, reps, device, clock=clock)
        vit_times = time_interleaved(dict(viterbi), reps, device, clock=clock)
        memory = {}
        for name, fn in nll.items():
            gc.collect()
            memory[name] = saved_bytes(fn)
        peaks = {name: peak_cuda_bytes(train_step(fn), device) for name, fn in nll.items()}
        rows.append(dict(size=(batch, seq_len, num_tags), nll=nll_times, viterbi=vit_times, memory=memory,
                         peak=peaks, repeats=reps))
        print(f"done {batch}x{seq_len}x{num_tags}", flush=True)
    return rows


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}"


def format_tables(rows: list[dict], header: str, backends: list[str]) -> str:
    variants = {layer_name("first-order", b): b for b in backends}
    peers = ("pytorch-crf", "torch-struct")
    out = [header, ""]
    out.append("### First order: neurocrf vs peers (median ms; ratio = neurocrf / peer, lower is better)")
    out.append("")
    out.append("one column per backend (`backend=` of the layers).")
    out.append("")
    labels = list(variants.values())
    ratios = [f"{label} / {peer}" for peer in peers for label in labels]
    out.append("| B x T x L | op | " + " | ".join(labels + list(peers) + ratios) + " |")
    out.append("|---|---|" + "---|" * (len(labels) + len(peers) + len(ratios)))

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for row in rows:
        size = "x".join(map(str, row["size"]))
        for op in ("nll", "viterbi"):
            t = row[op]
            label = "NLL fwd+bwd" if op == "nll" else "Viterbi"
            cells = [ms(t.get(name)) for name in variants] + [ms(t.get(peer)) for peer in peers]
            cells += [ratio(t.get(name), t.get(peer)) for peer in peers for name in variants]
            out.append(f"| {size} | {label} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("### Second-order and precursor-induced vs neurocrf first order (ratio of median times)")
    out.append("")
    out.append("| B x T x L | op | first-order ms | second-order ms | precursor ms | second / first"
               " | precursor / first |")
    out.append("|---|---|---|---|---|---|---|")
    for row in rows:
        size = "x".join(map(str, row["size"]))
        for op in ("nll", "viterbi"):
            t = row[op]
            for backend in backends:
                first, second, prec = (t.get(layer_name(kind, backend)) for kind in ("first-order", "second-order",
                                                                                   "precursor"))
                label = ("NLL fwd+bwd" if op == "nll" else "Viterbi") + f" [{backend}]"
                out.append(f"| {size} | {label} | {ms(first)} | {ms(second)} | {ms(prec)} | {ratio(second, first)} | "
                           f"{ratio(prec, first)} |")
    out.append("")
    out.append("### Memory of NLL forward+backward (MiB saved by autograd for backward; CUDA: peak allocated)")
    out.append("")
    names = list(rows[0]["memory"])
    out.append("| B x T x L | " + " | ".join(names) + " |")
    out.append("|---|" + "---|" * len(names))
    for row in rows:
        size = "x".join(map(str, row["size"]))
        cells = []
        for name in names:
            saved = row["memory"].get(name)
            peak = row["peak"].get(name)
            cell = "-" if saved is None else f"{saved / 2**20:.2f}"
            if peak is not None:
                cell += f" (peak {peak / 2**20:.1f})"
            cells.append(cell)
        out.append(f"| {size} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--clock", choices=("wall", "thread"), default="wall",
                        help="wall time, or CPU time of the calling thread (CPU only)")
    parser.add_argument("--no-pin-malloc", action="store_true", help="keep glibc's dynamic malloc thresholds")
    parser.add_argument("--out", help="also write the markdown tables to this file")
    parser.add_argument("--backends", help="comma-separated engine backends (torch, compiled, triton): the neurocrf "
                        "layers run once per backend; default: torch and the device's fast backend if available")
    parser.add_argument("--sizes", help="BxTxL sizes, comma-separated (default: the device's list)")
    parser.add_argument("--skip", default="", help="leave out contenders whose name contains one of these, "
                        "comma-separated (e.g. second-order)")
    parser.add_argument("--constrained-precursor", action="store_true",
                        help="the precursor layer with IOB2 constraints (its default) instead of unconstrained")
    args = parser.parse_args()
    if args.clock == "thread" and args.device != "cpu":
        parser.error("--clock thread measures CPU time; use it with --device cpu")
    torch.set_num_threads(args.threads)
    pinned = not args.no_pin_malloc and pin_malloc_thresholds()
    device = torch.device(args.device)
    sizes = CUDA_SIZES if device.type == "cuda" else CPU_SIZES
    if args.sizes:
        sizes = [tuple(int(x) for x in size.split("x")) for size in args.sizes.split(",")]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()] if args.backends else default_backends(device)
    machine = (torch.cuda.get_device_name(device) if device.type == "cuda"
               else f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread(s)")
    header = (f"## CRF benchmark on {args.device} ({machine}); torch {torch.__version__}; "
              f"{args.repeats} interleaved rounds, medians of {args.clock} time; "
              f"malloc thresholds {'pinned' if pinned else 'dynamic'}")
    rows = run(sizes, device, args.repeats, not args.no_peers, backends, [x for x in args.skip.split(",") if x],
               args.constrained_precursor, time.thread_time if args.clock == "thread" else time.perf_counter)
    text = format_tables(rows, header, backends)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
