"""Tools beside the training run: benchmark, memory and FLOP footprint, switch check (map:
docs/architecture.md)."""
