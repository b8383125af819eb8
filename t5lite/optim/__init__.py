"""The optimizers and the state they update."""
