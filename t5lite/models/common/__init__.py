"""What both model families are built from and share: layers, attention, masks, the stack,
the wrapper base, losses, features, precision and the shared settings (map:
docs/architecture.md)."""
