"""t5lite."""
