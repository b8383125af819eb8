"""The data layer: vocabularies, SeqIO tasks, sources, the input pipeline, synthetic
batches and the demo corpus.

This package's `__init__` imports nothing, so that `import t5lite.data.synthetic` (the
benchmark's batches, numpy only) never pulls in TensorFlow or SeqIO. Modules built on
TensorFlow / SeqIO live beside it and are imported explicitly by the code that needs them
(through `edge.import_tasks` from the layers above):

    synthetic.py       deterministic random batches (numpy only)
    settings.py        where data and vocabulary live: DataSettings, gin macros, environment
    readers.py         the raw formats: the Pile jsonl(.zst), MultiNLI, GLUE TSV, SQuAD JSON
    vocab_training.py  train a T5-style SentencePiece model (`python -m t5lite.vocab`)
    demo_corpus.py     a small made-up corpus in those formats (demos, tests)
    edge.py            the door into the TensorFlow side: import_tasks(DataSettings)
    tf_env.py          imports TensorFlow with its GPUs hidden
    vocabularies.py    SentencePiece + 100 extra ids, path read on first use
    sources.py         SeqIO data sources: local files or a local prepared TFDS dataset
    tasks.py           the SeqIO tasks (registered on import), configure(DataSettings)
    pipeline.py        task -> this process's numpy batches, resumable position
    package_check.py   whether the released seqio / tensorflow-datasets are what imports

The errors it raises (DataError and its kinds) live in `t5lite.errors`. See docs/data.md.
"""
