"""Which rows of each global batch a process reads, and the stream's fixed data shards:
plain Python, shared by the partitioner and every reader."""
