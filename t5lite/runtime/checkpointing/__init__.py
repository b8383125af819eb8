"""Saving and restoring a run's state."""
