"""One process's life in a run: joining, the lock, the disk, signals, the watchdog."""
