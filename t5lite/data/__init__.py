"""Input pipelines.

This package's `__init__` imports nothing, so that `import t5lite.data.synthetic` (the
benchmark's batches, numpy only) never pulls in TensorFlow or SeqIO. Modules built on
TensorFlow / SeqIO live beside it and are imported explicitly by the code that needs them:

    synthetic.py     deterministic random batches (numpy only)
    errors.py        the data edge's user-facing errors (no TensorFlow)
    settings.py      where data and vocabulary live: gin macros / environment variables
    readers.py       the raw formats: the Pile jsonl(.zst), MultiNLI, GLUE TSV, SQuAD JSON
    demo_corpus.py   a small made-up corpus in those formats (demos, tests)
    tf_env.py        imports TensorFlow with its GPUs hidden
    vocabularies.py  SentencePiece + 100 extra ids, path read on first use
    sources.py       SeqIO data sources: local files or a local prepared TFDS dataset
    tasks.py         the SeqIO tasks (registered on import), configure(...)
    pipeline.py      task -> this process's numpy batches, resumable position

See docs/data.md.
"""
