"""What one CRF call costs around the Triton kernels: aten ops, host syncs and kernel launches.

A :class:`CallCounter` (a ``TorchDispatchMode``) records every aten op a call dispatches outside
the Triton kernels (view ops excluded: they launch nothing), the ops among them that make the host
wait for the device (:data:`SYNC_OPS`: reading a value, or an output whose shape depends on data),
and the Triton launches (:data:`~neurocrf.structs.engine.triton.runtime.LAUNCHES`). On a GPU each
non-view op is a kernel launch of a few microseconds of CPU time and each sync stops the host
from running ahead of the device and makes the call impossible to capture in a CUDA graph.

:func:`measure` counts the calls of the three layers (NLL forward + backward, Viterbi, k best) at
one size; on CPU tensors it needs ``TRITON_INTERPRET=1`` (the interpreter runs the same Python
around the kernels as a GPU does).

    TRITON_INTERPRET=1 python -m tools.gpu_calls                # 32 x 40, CPU tensors, interpreter
    python -m tools.gpu_calls --device cuda --batch 256 --seq-len 128
"""

from __future__ import annotations

import argparse
import collections
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = frozenset({"_local_scalar_dense", "item", "equal", "is_nonzero", "nonzero", "nonzero_static",
                      "masked_select", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
                      "repeat_interleave", "bincount", "histc", "masked_scatter", "_assert_async", "tolist",
                      "allclose", "argwhere"})
"""aten ops that read a device value on the host, or whose output shape depends on data
(boolean-mask indexing dispatches ``nonzero``)."""

TAGS_IOB2 = ["O"] + [f"{prefix}-{kind}" for kind in ("PER", "ORG", "LOC", "MISC") for prefix in "BI"]
"""Nine IOB2 tags: the precursor layer's tag set (13 states)."""


@dataclass
class Counts:
    """Non-view aten ops, host syncs and Triton launches of one call, with the op names."""

    ops: int = 0
    syncs: int = 0
    launches: int = 0
    names: collections.Counter = field(default_factory=collections.Counter)
    sync_names: collections.Counter = field(default_factory=collections.Counter)

    def row(self) -> str:
        return f"{self.ops} / {self.syncs} / {self.launches}"


class CallCounter(TorchDispatchMode):
    """Count the aten ops dispatched while active (views apart), the host syncs among them, and
    the Triton launches; ops dispatched by the Triton interpreter inside a launch are not counted
    (on a GPU they do not exist)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts = Counts()
        self._paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._paused:
            name = func.overloadpacket.__name__
            if not func.is_view:
                self.counts.ops += 1
                self.counts.names[name] += 1
            if name in SYNC_OPS:
                self.counts.syncs += 1
                self.counts.sync_names[name] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def launching(self) -> Iterator[None]:
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1


@contextlib.contextmanager
def counting() -> Iterator[Counts]:
    """Counts of the code run inside the block (the Triton launches from the runtime's counter)."""
    from neurocrf.structs.engine.triton import runtime

    original = runtime.launch
    counter = CallCounter()

    def launch(*args, **kwargs):
        with counter.launching():
            return original(*args, **kwargs)

    before = sum(runtime.LAUNCHES.values())
    runtime.launch = launch
    try:
        with counter:
            yield counter.counts
    finally:
        runtime.launch = original
        counter.counts.launches = sum(runtime.LAUNCHES.values()) - before


def layers(device: torch.device | str = "cpu", backend: str = "triton", num_tags: int = 9,
           pair_tags: int = 5) -> dict[str, torch.nn.Module]:
    """The three layers of the measurements: first order (``num_tags``), precursor (nine IOB2
    tags, constrained), second order (``pair_tags``), with random parameters."""
    from neurocrf.structs import LinearChainCRF, PrecursorInducedCRF, SecondOrderCRF

    built = {"first order": LinearChainCRF(num_tags, backend=backend),
             "precursor": PrecursorInducedCRF(TAGS_IOB2, "IOB2", backend=backend),
             "second order": SecondOrderCRF(pair_tags, backend=backend)}
    generator = torch.Generator().manual_seed(0)
    for layer in built.values():
        with torch.no_grad():
            for param in layer.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    return {name: layer.to(device) for name, layer in built.items()}


def inputs(layer: torch.nn.Module, batch: int, seq_len: int, device: torch.device | str, dtype=torch.float32
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Emissions ``[B, T, L]``, prefix mask ``[B, T]`` with lengths from ``T`` down to about ``T / 2``,
    and the tags of the layer's Viterbi paths (admissible under its constraints)."""
    generator = torch.Generator().manual_seed(1)
    emissions = torch.randn(batch, seq_len, layer.num_tags, generator=generator, dtype=dtype)
    lengths = seq_len - torch.arange(batch) * (seq_len // 2) // max(batch, 1)
    mask = torch.arange(seq_len) < lengths.unsqueeze(1)
    emissions, mask = emissions.to(device), mask.to(device)
    with torch.no_grad():
        tags = layer.decode(emissions, mask).clamp(min=0)
    return emissions, mask, tags


def calls(layer: torch.nn.Module, emissions: torch.Tensor, mask: torch.Tensor, tags: torch.Tensor, k: int = 4
          ) -> dict[str, Callable[[], object]]:
    """The measured calls: NLL forward + backward (emissions and parameters get gradients),
    Viterbi and the ``k`` best paths."""

    def nll() -> None:
        layer.zero_grad(set_to_none=True)  # as an optimizer step leaves them: no accumulation
        leaf = emissions.detach().requires_grad_()
        layer(leaf, tags, mask).backward()

    def viterbi():
        with torch.no_grad():
            return layer.decode(emissions, mask)

    def kbest():
        with torch.no_grad():
            return layer.nbest(emissions, mask, k=k)

    return {"nll": nll, "viterbi": viterbi, "kbest": kbest}


def measure(batch: int = 32, seq_len: int = 40, device: torch.device | str = "cpu", num_tags: int = 9,
            pair_tags: int = 5, k: int = 4) -> dict[str, dict[str, Counts]]:
    """Counts per layer and call, each call run once before it is counted (first-use work such
    as the self-check and kernel compilation is not part of a call)."""
    out: dict[str, dict[str, Counts]] = {}
    for name, layer in layers(device, num_tags=num_tags, pair_tags=pair_tags).items():
        emissions, mask, tags = inputs(layer, batch, seq_len, device)
        out[name] = {}
        for call, run in calls(layer, emissions, mask, tags, k).items():
            run()
            with counting() as counts:
                run()
            out[name][call] = counts
    return out


def table(results: dict[str, dict[str, Counts]]) -> str:
    """Markdown: one row per layer, ``ops / syncs / launches`` per call."""
    lines = ["| layer | NLL fwd+bwd: ops / syncs / launches | Viterbi | k best |", "|---|---|---|---|"]
    for name, row in results.items():
        lines.append(f"| {name} | {row['nll'].row()} | {row['viterbi'].row()} | {row['kbest'].row()} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=40)
    parser.add_argument("--tags", type=int, default=9, help="first-order tags (the precursor has 9 IOB2 tags)")
    parser.add_argument("--pair-tags", type=int, default=5, help="second-order tags")
    parser.add_argument("--ops", action="store_true", help="also list the ops of each call")
    args = parser.parse_args(argv)
    results = measure(args.batch, args.seq_len, args.device, args.tags, args.pair_tags)
    print(f"{args.batch} x {args.seq_len} on {args.device}\n")
    print(table(results))
    if args.ops:
        for name, row in results.items():
            for call, counts in row.items():
                print(f"\n{name} {call}: {dict(counts.names)}; syncs {dict(counts.sync_names)}")


if __name__ == "__main__":
    main()
