"""crf.decoder(): the exportable Viterbi against eager decode and brute force, exported with
torch.export and the dynamo ONNX exporter (run by onnxruntime) at other shapes than the example's,
and tracing that would freeze the sequence length refused."""

from __future__ import annotations

import io
import itertools
import warnings

import pytest
import torch

from neurocrf.structs import LinearChainCRF, allowed_transitions, build_crf, pair_emissions
from neurocrf.structs.export import dynamic_shapes

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
KINDS = ("first_order", "second_order", "precursor")


def layer(kind: str, constrained: bool = True, seed: int = 0):
    """A layer with spread-out random weights, so that paths differ from per-token argmaxes."""
    torch.manual_seed(seed)
    crf = build_crf(kind, TAGS, "IOB2", constrained=constrained)
    with torch.no_grad():
        for param in crf.parameters():
            param.normal_(0.0, 1.5)
    return crf


def random_batch(batch: int, seq_len: int, seed: int, num_tags: int = len(TAGS)) -> tuple[torch.Tensor, torch.Tensor]:
    """Emissions and a mask with holes (and some empty rows)."""
    generator = torch.Generator().manual_seed(seed)
    emissions = torch.randn(batch, seq_len, num_tags, generator=generator) * 2
    mask = torch.rand(batch, seq_len, generator=generator) < 0.7
    return emissions, mask


def assert_decodes_like_eager(run, crf, shapes) -> None:
    for seed, (batch, seq_len) in enumerate(shapes):
        emissions, mask = random_batch(batch, seq_len, seed)
        got = torch.as_tensor(run(emissions, mask))
        assert torch.equal(got, crf.decode(emissions, mask)), (batch, seq_len)


# shapes other than the export example (3, 6): one token, long rows, a single row, an empty row
OTHER_SHAPES = [(1, 1), (2, 2), (4, 11), (1, 40), (5, 17), (2, 0)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("constrained", [True, False])
def test_decoder_equals_decode(kind, constrained):
    crf = layer(kind, constrained)
    decoder = crf.decoder()
    for seed in range(12):
        batch, seq_len = 1 + seed % 4, seed % 9
        emissions, mask = random_batch(batch, seq_len, seed)
        assert torch.equal(decoder(emissions, mask), crf.decode(emissions, mask))
        assert torch.equal(decoder(emissions.double(), mask), crf.decode(emissions.double(), mask))
    emissions = torch.randn(3, 5, len(TAGS))
    assert torch.equal(decoder(emissions), crf.decode(emissions))  # no mask: every position


@pytest.mark.parametrize("kind", KINDS)
def test_decoder_against_brute_force(kind):
    """The best tag sequence over each row's True positions, by enumeration."""
    crf = layer(kind).double()
    emissions, mask = random_batch(6, 5, seed=3)
    emissions = emissions.double()
    got = crf.decoder()(emissions, mask)
    for row in range(emissions.shape[0]):
        positions = mask[row].nonzero().squeeze(1)
        labels = torch.tensor(list(itertools.product(range(len(TAGS)), repeat=len(positions))), dtype=torch.long)
        every = torch.zeros(len(labels), emissions.shape[1], dtype=torch.long)
        every[:, positions] = labels.view(len(labels), -1)
        with torch.no_grad():
            scores = crf.score(emissions[row].expand(len(labels), -1, -1), every, mask[row].expand(len(labels), -1))
        expected = every[scores.argmax()].masked_fill(~mask[row], -1)
        assert torch.equal(got[row], expected), row


@pytest.mark.parametrize("kind", KINDS)
def test_decoder_row_without_a_path_is_minus_one(kind):
    crf = layer(kind)
    emissions, mask = random_batch(3, 4, seed=5)
    mask[1] = True
    emissions[1, :, :4] = float("-inf")  # only I-LOC is left, and an IOB2 sentence cannot start with it
    tags = crf.decoder()(emissions, mask)
    assert tags[1].tolist() == [-1] * 4
    assert torch.equal(tags, crf.decode(emissions, mask))


def test_decoder_pair_emissions_and_empty_batch():
    crf = layer("first_order")
    emissions, mask = random_batch(4, 7, seed=6)
    pairs = pair_emissions(emissions, torch.randn(4, 7, len(TAGS), len(TAGS)))
    assert torch.equal(crf.decoder()(pairs, mask), crf.decode(pairs, mask))
    empty = torch.randn(0, 3, len(TAGS)), torch.ones(0, 3, dtype=torch.bool)
    assert crf.decoder()(*empty).shape == (0, 3) and torch.equal(crf.decoder()(*empty), crf.decode(*empty))
    with pytest.raises(ValueError, match="tags in the last dim"):
        crf.decoder()(torch.randn(2, 3, 4), torch.ones(2, 3, dtype=torch.bool))


def test_decoder_shares_the_layer_parameters():
    crf = layer("first_order")
    decoder = crf.decoder()
    emissions, mask = random_batch(3, 8, seed=7)
    with torch.no_grad():
        crf.transitions.mul_(-3.0)
    assert torch.equal(decoder(emissions, mask), crf.decode(emissions, mask))
    assert {name for name, _ in decoder.named_parameters()} == {f"crf.{name}" for name, _ in crf.named_parameters()}


@pytest.mark.parametrize("kind", KINDS)
def test_exported_decoder_equals_decode(kind, tmp_path):
    """One torch.export program per layer: its module, the same program saved and loaded, and its
    ONNX translation run by onnxruntime all decode like the eager layer at other shapes."""
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    crf = layer(kind)
    example = random_batch(3, 6, seed=99)
    program = torch.export.export(crf.decoder(), example, dynamic_shapes=dynamic_shapes())
    assert_decodes_like_eager(program.module(), crf, OTHER_SHAPES)

    torch.export.save(program, tmp_path / "decoder.pt2")
    loaded = torch.export.load(tmp_path / "decoder.pt2").module()
    assert_decodes_like_eager(loaded, crf, OTHER_SHAPES[:3])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_program = torch.onnx.export(program, dynamo=True, output_names=["tags"], verbose=False)
    onnx_program.save(str(tmp_path / "decoder.onnx"))
    session = onnxruntime.InferenceSession(str(tmp_path / "decoder.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["emissions", "mask"]

    def run(emissions, mask):
        return session.run(None, {"emissions": emissions.numpy(), "mask": mask.numpy()})[0]

    assert_decodes_like_eager(run, crf, OTHER_SHAPES)


@pytest.mark.slow
def test_exported_decoder_pair_emissions_and_float64():
    crf = layer("first_order").double()
    emissions, mask = random_batch(3, 6, seed=1)
    pairs = pair_emissions(emissions.double(), torch.randn(3, 6, len(TAGS), len(TAGS), dtype=torch.float64))
    shapes = {"emissions": dynamic_shapes()["emissions"], "mask": dynamic_shapes()["mask"]}
    program = torch.export.export(crf.decoder(), (pairs, mask), dynamic_shapes=shapes).module()
    for seed, (batch, seq_len) in enumerate(OTHER_SHAPES):
        emissions, mask = random_batch(batch, seq_len, seed)
        scores = torch.randn(batch, seq_len, len(TAGS), len(TAGS), dtype=torch.float64)
        pairs = pair_emissions(emissions.double(), scores)
        assert torch.equal(program(pairs, mask), crf.decode(pairs, mask))


class _Decode(torch.nn.Module):
    def __init__(self, crf) -> None:
        super().__init__()
        self.crf = crf

    def forward(self, emissions, mask):
        return self.crf.decode(emissions, mask)


def test_tracing_is_refused():
    """torch.jit.trace and the legacy ONNX exporter record one sequence length and used to return
    wrong paths at every other length, silently; now they raise and name the exporters to use.
    torch.export of the eager methods names crf.decoder()."""
    crf = LinearChainCRF(len(TAGS), allowed_transitions(TAGS, "IOB2"))
    example = random_batch(2, 5, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module in (crf.decoder(), _Decode(crf)):
            with pytest.raises(RuntimeError, match=r"torch\.export"):
                torch.jit.trace(module, example)
            with pytest.raises(RuntimeError, match=r"dynamo=True"):
                torch.onnx.export(module, example, io.BytesIO(), dynamo=False)
        with pytest.raises(RuntimeError, match=r"export crf\.decoder\(\)"):  # used to fail on a data-dependent int
            torch.export.export(_Decode(crf), example)
    assert torch.equal(crf.decoder()(*example), crf.decode(*example))  # outside a trace: fine
