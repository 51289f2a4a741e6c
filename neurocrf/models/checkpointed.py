"""What a trained model keeps in its checkpoint beside the weights: the best dev score so far.

:class:`Checkpointed` is a mixin of the LightningModules (the tagger and the supertagger)::

    class Tagger(Checkpointed, pl.LightningModule):
        best_metric = "val/f1"
        ...
        def on_validation_epoch_end(self):
            ...
            self.track_best(f1)        # logs val/f1_best, the best over the epochs so far

The best score survives checkpoints (``checkpoint["neurocrf"]["val_f1_best"]``), so a resumed run
compares its new epochs with the earlier ones, and ``val/f1_best`` stays right after a resume.
"""

from __future__ import annotations

from typing import Any, ClassVar


class Checkpointed:
    """Mixin: the best value of ``best_metric`` over the validation epochs (sanity checks
    excluded), logged as ``<best_metric>_best`` and kept in the checkpoint.

    >>> class Model(Checkpointed):
    ...     best_metric = "val/supertag_acc"
    >>> checkpoint = {}
    >>> model = Model()
    >>> model.best_score = 0.9
    >>> model.on_save_checkpoint(checkpoint)
    >>> checkpoint
    {'neurocrf': {'val_supertag_acc_best': 0.9}}
    """

    best_metric: ClassVar[str] = "val/f1"
    best_score: float = 0.0

    @classmethod
    def best_key(cls) -> str:
        """The checkpoint key of the best score: ``val/f1`` -> ``val_f1_best``."""
        return f"{cls.best_metric.replace('/', '_')}_best"

    def track_best(self, value: float) -> None:
        """Take this validation epoch's ``best_metric`` ``value`` into the best so far (not during
        the sanity check) and log the best as ``<best_metric>_best``."""
        if not self.trainer.sanity_checking:
            self.best_score = max(self.best_score, float(value))
        self.log(f"{self.best_metric}_best", self.best_score, sync_dist=True, prog_bar=True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint.setdefault("neurocrf", {})[self.best_key()] = float(self.best_score)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.best_score = float(checkpoint.get("neurocrf", {}).get(self.best_key(), 0.0))
