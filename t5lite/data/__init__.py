"""Input pipelines.

This package's `__init__` imports nothing, so that `import t5lite.data.synthetic` (the
benchmark's batches, numpy only) never pulls in TensorFlow or SeqIO. Modules built on
TensorFlow / SeqIO (vocabularies, tasks, the SeqIO-to-global-batch pipeline) live beside
it and are imported explicitly by the code that needs them.
"""
