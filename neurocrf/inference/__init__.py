"""Prediction at corpus scale: one streaming path from an input file to an output file.

``writers``   CoNLL and JSON-lines output, one prediction at a time
``output``    the output file: written to a temporary file, renamed onto the target at the end
``progress``  the progress bar on stderr
``run``       :class:`~neurocrf.inference.run.FilePrediction`: reader -> windows -> model -> writer
``sharded``   the same over several processes (Lightning's prediction loop), resumable
``ranks``     what the processes of a multi-process run agree on before they predict

The windows and batches are the model's own (:mod:`neurocrf.models.batching`, used by
:meth:`~neurocrf.models.tagger.Tagger.predict_iter`), so a file and a list of sentences are
predicted alike.
"""
