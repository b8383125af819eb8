"""T5X's Adafactor state as this run's optimizer state, so that a T5X run continues in
t5lite at its step (INITIAL_CHECKPOINT_STATE='train_state').

T5X keeps, per parameter (its 2-D view: heads joined, one parameter per layer),
`{m, v, v_row, v_col}` (an unused slot is a float32 zero of shape [1]) and one `step`.
t5lite's Adafactor (`t5lite.optim.adafactor`) factors the same view, so each moment
maps by a reshape in the unfused, unscanned layout:

    T5X v_row [d1], v_col [d0]   ->  v_row / v_col of the leaf (e.g. [embed], [heads, kv])
    T5X v [shape], m [shape]     ->  v [leaf shape], the momentum trace [leaf shape]

and into a fused / scanned layout through the parameters' own layout conversion (each
moment spread over the axes it was averaged over, converted, then taken back). The update
count of every stage becomes T5X's step. Where a parameter's factoring, the momentum or
the optimizer itself differ, CheckpointMismatchError says so in one line: the state does
not map, and INITIAL_CHECKPOINT_STATE='params' starts the optimizer fresh.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

import jax
import numpy as np
import optax

from t5lite.errors import CheckpointMismatchError
from t5lite.formats import t5x_params
from t5lite.models import layouts
from t5lite.models.common.param_paths import flatten, unflatten
from t5lite.optim import adafactor

SLOTS = ("v_row", "v_col", "v", "m")
FRESH = "set INITIAL_CHECKPOINT_STATE='params' to start the optimizer fresh at step 0"


def _plain(model):
    return type(model)(layouts.canonical_config(model.config))


def _slots_by_param(param_states: Mapping[str, Any]) -> Dict[str, Dict[str, np.ndarray]]:
    """{'encoder/layers_0/attention/query/kernel': {m, v, v_row, v_col}} from T5X's tree."""
    flat = flatten(param_states)
    by_param: Dict[str, Dict[str, np.ndarray]] = {}
    for name, value in flat.items():
        param, _, slot = name.rpartition("/")
        by_param.setdefault(t5x_params.t5lite_name(param), {})[slot] = np.asarray(
            value, np.float32)
    return by_param


def _plain_moments(param_states, plain, factoring, origin: str):
    """Four trees (v_row, v_col, v, m) in the plain layout's state shapes, and whether T5X
    kept momentum."""
    params = flatten(plain.abstract_variables()["params"])
    axes = flatten(plain.logical_axes()["params"])  # PartitionSpecs: tuples, not Mappings
    given = _slots_by_param(param_states)
    out = {slot: {} for slot in SLOTS}
    momentum = None
    for name, leaf in params.items():
        shape = tuple(leaf.shape)
        slots = given.get(name)
        if slots is None or not set(SLOTS[:3]) <= set(slots):
            raise CheckpointMismatchError(f"{origin} holds no Adafactor state (v, v_row, "
                                          f"v_col) for parameter {name!r}; {FRESH}")
        plan = adafactor.plan_leaf(shape, tuple(axes[name]), **factoring)
        theirs = slots["v_row"].size > 1
        if theirs != plan.factored:
            how = {True: "factored", False: "kept whole"}
            raise CheckpointMismatchError(
                f"{origin}: T5X's Adafactor {how[theirs]} the second moment of {name!r}, "
                f"this run's Adafactor {how[plan.factored]} (adafactor.factored / "
                f"min_dim_size_to_factor differ from the T5X run's); {FRESH}")
        wanted = adafactor.state_shapes(shape, plan)
        for slot, want in zip(SLOTS[:3], wanted):
            value = slots[slot]
            if value.size != int(np.prod(want)):
                raise CheckpointMismatchError(
                    f"{origin}: the Adafactor {slot} of {name!r} has shape {list(value.shape)}, "
                    f"this run needs {list(want)}; check the model size; {FRESH}")
            out[slot][name] = value.reshape(want)
        m = slots.get("m", np.zeros((1,), np.float32))
        has_m = m.size == int(np.prod(shape)) and m.size > 1
        momentum = has_m if momentum is None else momentum
        out["m"][name] = m.reshape(shape) if has_m else np.zeros(shape, np.float32)
    extra = sorted(set(given) - set(params))
    if extra:
        raise CheckpointMismatchError(f"{origin} holds Adafactor state for {extra[0]!r}, which "
                                      f"this model has no parameter for; {FRESH}")
    if not momentum:
        del out["m"]  # nothing to carry (and to convert)
    return {slot: unflatten(tree) for slot, tree in out.items()}, bool(momentum)


def _to_layout(moments, plain, model, factoring):
    """The plain layout's moments in `model`'s layout (fused QKV, scanned layers)."""
    src, dst = plain.config, model.config
    if layouts.config_layout(src) == layouts.config_layout(dst):
        return moments
    src_plans = adafactor.plan_tree(plain.abstract_variables()["params"],
                                    plain.logical_axes()["params"], **factoring)
    dst_params = model.abstract_variables()["params"]
    dst_plans = adafactor.plan_tree(dst_params, model.logical_axes()["params"], **factoring)
    full_shape = jax.tree.map(lambda p: tuple(p.shape), plain.abstract_variables()["params"])

    def spread(value, plan, shape, slot):  # a moment over the whole parameter's shape
        if slot == "v_row" and plan.factored:
            return np.broadcast_to(np.expand_dims(value, plan.col), shape)
        if slot == "v_col" and plan.factored:
            return np.broadcast_to(np.expand_dims(value, plan.row), shape)
        if slot in ("v", "m") and (slot == "m" or not plan.factored):
            return value
        return np.zeros(shape, np.float32)

    def gather(value, plan, slot):  # back to the moment's own shape in the new layout
        value = np.asarray(value)
        if slot == "v_row" and plan.factored:
            return value[tuple(0 if a in plan.col else slice(None) for a in range(value.ndim))]
        if slot == "v_col" and plan.factored:
            return value[tuple(0 if a in plan.row else slice(None) for a in range(value.ndim))]
        if slot == "m" or (slot == "v" and not plan.factored):
            return value
        return np.zeros((1,), np.float32)

    out = {}
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        for slot, tree in moments.items():
            full = jax.tree.map(lambda v, pl, s, slot=slot: spread(v, pl, s, slot), tree,
                                src_plans, full_shape, is_leaf=lambda x: isinstance(x, np.ndarray))
            converted = layouts.convert_params({"params": full}, src, dst)["params"]
            out[slot] = jax.tree.map(lambda v, pl, slot=slot: gather(v, pl, slot), converted,
                                     dst_plans)
    return out


def opt_state_from_t5x(t5x_state: Mapping[str, Any], model, abstract_opt_state,
                       factoring: Mapping[str, Any], origin: str):
    """This run's optimizer state (numpy, shaped as `abstract_opt_state`) from T5X's
    `state` ({"step", "param_states"}); `factoring`: the run's Adafactor options
    (`Optimizer.factoring`), None for another optimizer."""
    if factoring is None:
        raise CheckpointMismatchError(f"{origin}: T5X's Adafactor state maps only onto "
                                      f"Adafactor, and this run's optimizer is another; {FRESH}")
    step = np.int32(np.asarray(t5x_state["step"]))
    plain = _plain(model)
    moments, t5x_momentum = _plain_moments(t5x_state.get("param_states") or {}, plain,
                                           factoring, origin)
    moments = _to_layout(moments, plain, model, factoring)
    found = {"adafactor": False, "momentum": False}

    def fill(node):
        if isinstance(node, adafactor.AdafactorState):
            found["adafactor"] = True
            return adafactor.AdafactorState(step, moments["v_row"], moments["v_col"],
                                            moments["v"])
        if isinstance(node, optax.EmaState):
            found["momentum"] = True
            return optax.EmaState(count=step, ema=moments.get("m", node.ema))
        if isinstance(node, optax.ScaleByScheduleState):
            return optax.ScaleByScheduleState(count=step)
        if isinstance(node, tuple) and not hasattr(node, "_fields"):
            return tuple(fill(n) for n in node)
        if jax.tree_util.tree_leaves(node):
            raise CheckpointMismatchError(f"{origin}: this run's optimizer keeps state "
                                          f"({type(node).__name__}) that T5X's Adafactor has "
                                          f"no counterpart for; {FRESH}")
        return node

    state = fill(abstract_opt_state)
    if not found["adafactor"]:
        raise CheckpointMismatchError(f"{origin}: this run's optimizer is not Adafactor, onto "
                                      f"which T5X's Adafactor state would map; {FRESH}")
    if found["momentum"] != t5x_momentum:
        ours = "momentum" if found["momentum"] else "no momentum"
        theirs = "beta1 (momentum)" if t5x_momentum else "no beta1 (momentum)"
        raise CheckpointMismatchError(f"{origin}: the T5X run's Adafactor had {theirs}, this "
                                      f"run's has {ours} (adafactor.momentum); {FRESH}")
    return state
