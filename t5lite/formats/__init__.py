"""Checkpoint formats on disk: t5lite's own Orbax layout and T5X's."""
