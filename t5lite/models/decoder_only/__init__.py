"""The decoder-only family (GPT, LLaMA, GLaM, Mixtral): its config, network and wrapper (map:
docs/architecture.md)."""
