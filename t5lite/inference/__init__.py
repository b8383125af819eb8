"""Inference: restored checkpoints decoding and scoring on a mesh (map: docs/architecture.md)."""
