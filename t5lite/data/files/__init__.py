"""Reading local data files resumably, in plain Python."""
