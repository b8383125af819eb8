"""Configuration at the edge: flags, gin files and macros, registrations, the commands' shared
body (map: docs/architecture.md)."""
