"""Interoperability: Hugging Face checkpoints in and out, converted checkpoints (map:
docs/architecture.md)."""
