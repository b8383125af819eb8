"""Model library: networks, layers and wrappers (no TensorFlow, SeqIO or t5 here)."""
