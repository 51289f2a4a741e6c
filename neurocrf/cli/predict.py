"""Tag a file with a trained checkpoint (``configs/predict.yaml``).

    neurocrf-predict ckpt_path=.../last.ckpt input=corpus.conll                  # CoNLL out
    neurocrf-predict ckpt_path=.../last.ckpt input=sentences.txt format=jsonl nbest=5
    zcat crawl.txt.gz | neurocrf-predict ckpt_path=... input=- output=- max_tokens=8192
    neurocrf-predict ckpt_path=... input=pubmed.txt.gz output=tags.conll.gz trainer=ddp trainer.devices=4

Input: a CoNLL column file (its columns are kept; the predicted tag is appended), plain text, one
whitespace-tokenised sentence per line, or JSON lines with a ``"tokens"`` list; ``-`` reads
standard input, a ``.gz`` name is decompressed. The format is ``input_format``, else the file's
extension, else read off a bounded prefix; a file that reads both ways (every line with the same
number of fields and no tag column) is refused with a message naming it: see
:mod:`neurocrf.data.inputs`.

Output: CoNLL (input columns + predicted tag [+ marginal confidence] [+ the n-best tag columns])
or JSON lines, one object per input sentence (per line for text input, empty lines included)::

    {"tokens": [...], "tags": [...], "scheme": "BIOES", "confidences": [...],
     "spans": [{"type": "PER", "start": 0, "end": 2, "confidence": 0.97}],
     "nbest": [{"tags": [...], "probability": 0.91, "log_probability": -0.094}, ...], "gold": [...]}

(with ``nbest``, an empty sentence has the one empty sequence, probability 1). CoNLL output of
text input has one block per input line, each ended by a blank line, so an empty input line is a
blank line of its own: see :mod:`neurocrf.inference.writers`.

The input is read and predicted a window of sentences at a time, and the output written as it
comes to a temporary file in its folder, renamed onto it at the end (``.gz``: compressed): a failed
or interrupted run (an error, Ctrl-C, SIGTERM) leaves no file at the output path and says which
input line it reached. A progress bar shows on stderr when it is a terminal. Checked before the
model is loaded: the output folder is writable, the output scheme exists, and the first window's
tokens (every column of CoNLL input) can be written as CoNLL columns (the others as they come).

Several devices or machines (``trainer.devices=N``, ``trainer.num_nodes``, ``trainer=ddp_sim``)
run through Lightning's prediction loop, each rank writing shards that are merged in input order:
the output is byte for byte that of one process, and a re-run after a preemption predicts only the
shards not complete yet (``resumable=true`` does the same on one device): see
:mod:`neurocrf.inference.sharded`. On several nodes (``srun``, ``torchrun``,
``hydra/launcher=submitit_slurm_ddp``) the input, checkpoint and output folder must be on a file
system that every node shares: :mod:`neurocrf.inference.ranks` checks it before predicting.

Every output sentence has exactly as many tokens as the input sentence. A model trained on joined
columns (``data.token_columns``, e.g. word + POS for the chunking features) reads the same columns
of CoNLL input (``token_columns: null`` takes them from the checkpoint).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from neurocrf.cli.utils import CONFIG_DIR
from neurocrf.values import to_plain

log = logging.getLogger(__name__)


def predict(cfg: DictConfig) -> dict[str, Any]:
    """Run the prediction described by ``cfg``; returns a summary (sentences, tokens, output)."""
    import torch

    from neurocrf.inference.run import FilePrediction
    from neurocrf.inference.sharded import is_distributed, predict_sharded
    from neurocrf.models.predict_options import PredictOptions
    from neurocrf.models.tagger import Tagger

    output = str(cfg.get("output") or Path(cfg.paths.output_dir) / f"predictions.{cfg.format}")
    options = PredictOptions(batch_size=cfg.batch_size, max_tokens=cfg.max_tokens, window=cfg.window, nbest=cfg.nbest,
                             precision=str(cfg.precision))  # 32 from the command line is a number
    job = FilePrediction(
        str(cfg.input), output, input_format=str(cfg.get("input_format", "auto")),
        reader=to_plain(cfg.get("reader"), "reader") or {}, output_format=str(cfg.format),
        scheme=cfg.get("scheme") or None, confidence=bool(cfg.get("confidence", False)),
        options=options,
    )
    log.info("reading %s as %s", cfg.input, job.input.format)
    model = Tagger.load(cfg.ckpt_path, map_location="cpu")
    columns = cfg.get("token_columns")
    columns = None if columns is None else list(columns)
    trainer = to_plain(cfg.get("trainer"), "trainer") or {}
    if cfg.get("resumable") or is_distributed(trainer):
        return predict_sharded(job, model, trainer, checkpoint=str(cfg.ckpt_path), progress=cfg.get("progress"),
                               shared_wait_s=float(cfg.get("shared_wait_s", 10)), token_columns=columns)
    accelerator = str(trainer.get("accelerator", "cpu"))
    gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    device = torch.device(cfg.get("device") or ("cuda" if gpu else "cpu"))
    return job.run(model.to(device), progress=cfg.get("progress"), token_columns=columns)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="predict")
def main(cfg: DictConfig) -> None:
    predict(cfg)


if __name__ == "__main__":
    main()
