"""The training run: mesh, train step, optimizers, checkpoints, the loop (map:
docs/architecture.md)."""
