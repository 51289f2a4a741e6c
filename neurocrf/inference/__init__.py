"""Prediction at corpus scale: one streaming path from an input file to an output file.

``batching``  windows of sentences, sorted by length and cut by count and token budget
``writers``   CoNLL and JSON-lines output, one prediction at a time
``output``    the output file: written to a temporary file, renamed onto the target at the end
``progress``  the progress bar on stderr
``run``       :class:`~neurocrf.inference.run.FilePrediction`: reader -> batches -> model -> order restored -> writer
``sharded``   the same over several processes (Lightning's prediction loop), resumable
"""
