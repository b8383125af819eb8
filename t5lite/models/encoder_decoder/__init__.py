"""The encoder-decoder family (T5 v1.1, original T5, Switch): its config, network and wrapper
(map: docs/architecture.md)."""
