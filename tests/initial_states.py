"""Initial train states made once per model and optimizer, then placed on any mesh.

Compiling a model's init costs about as much as compiling its train step (a threefry
draw per parameter), and the equivalence tests (meshes, microbatches, sequence and
expert axes) compile one for every mesh they compare. The values do not depend on the
mesh (jax's partitionable threefry draws the same numbers however the state is sharded),
so the first state made for a key is kept on the host and the later ones are that copy,
placed by the step functions' own shardings:

    state = initial_states.get(fns, key=(cfg, "adam"))

`key` must name everything the values depend on (the model's config, the optimizer and
its settings); the tests that check init itself (that the state is created sharded, an
init under a mesh) call `fns.init` directly.
"""
from __future__ import annotations

from typing import Any, Dict, Hashable

_HOST: Dict[Hashable, Any] = {}


def get(fns, key: Hashable, seed: int = 0):
    """`fns.init(PRNGKey(seed))`, as `fns.state_shardings` place it: compiled and run
    for the first `(key, seed)` of the test process, a placed host copy after that."""
    import jax
    if (key, seed) not in _HOST:
        state = fns.init(jax.random.PRNGKey(seed))
        _HOST[key, seed] = jax.device_get(state)
        return state
    return jax.device_put(_HOST[key, seed], fns.state_shardings)
