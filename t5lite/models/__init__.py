"""The model library: networks, wrappers, losses, decoding, precision, layouts, FLOPs (map:
docs/architecture.md)."""
