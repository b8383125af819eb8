"""t5lite: T5X-style training of T5 v1.1, GPT and LLaMA models in JAX/Flax (the map of the
package: docs/architecture.md)."""
