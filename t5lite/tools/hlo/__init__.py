"""Reading a program XLA compiled for a GPU from its optimized HLO text: its kernels with
their FLOPs, bytes and model parts (`gpu_program`), and what one kernel moves
(`kernel_bytes`). Text in, numbers out: needs nothing of t5lite."""
