"""The data layer: vocabularies, SeqIO tasks, readers, the input pipeline, synthetic batches (map:
docs/architecture.md)."""
