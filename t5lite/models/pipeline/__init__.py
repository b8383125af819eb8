"""Pipeline parallelism (needs nothing of t5lite: jax and flax only): a stack's layers cut
into chunks over the mesh's `stage` axis, each batch into microbatches that flow through
them (`schedule.run`), and the settings that choose it (`settings`).

The decoder-only stack runs through it (`t5lite.models.common.stack.run_stack`) when its config
sets PIPELINE_MICROBATCHES and the mesh has a stage axis over 1; its layers are stored
stacked either way (`t5lite.models.layouts`), so what a device holds is a quarter of them
on a four-stage mesh and a checkpoint moves between stage counts.
"""
from t5lite.models.pipeline.schedule import mesh_stages, run  # noqa: F401
from t5lite.models.pipeline.settings import (bubble_fraction, check,  # noqa: F401
                                             problem_on_mesh, problem_with_batch)
