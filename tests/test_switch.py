"""Switch Transformers (T5 with experts, issue 46): the configs' parameter counts against
a count by hand and transformers' own; top-1 batch-prioritized routing against a
hand-written dispatch; a random tiny transformers SwitchTransformersForConditionalGeneration
loads with the same logits where capacity cannot bind, and goes back tensor for tensor;
what transformers' Switch cannot hold, and a Switch file missing an expert, are one line;
a tiny Switch T5 trains with the routers' statistics of both stacks."""
import dataclasses
import functools
import json
import logging

import jax
import numpy as np
import pytest

from t5lite.models.configs import DecoderConfig, T5Config
from t5lite.models.moe import routing

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.numpy import load_file, save_file  # noqa: E402

from test_hf import (VOCAB, far_from_init, hf_t5_logits, logits, max_diff,  # noqa: E402
                     t5_batch)
from t5lite.interop import hf  # noqa: E402
from t5lite.models.model import EncoderDecoderModel  # noqa: E402

TOL = 1e-4
EXPERTS = 4
DIMS = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_heads=4, num_layers=4,
            num_decoder_layers=4, num_sparse_encoder_layers=2, num_sparse_decoder_layers=2,
            num_experts=EXPERTS, expert_capacity=64, router_aux_loss_coef=0.02,
            router_z_loss_coef=0.003)
WEIGHTS = "model.safetensors"


@pytest.fixture(autouse=True)
def _quiet_transformers():
    transformers.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)


# ----------------------------------------------------------------------------- counts


def _switch_by_hand(d, ff, layers, heads, kv, vocab, experts, buckets=32):
    attention = 4 * d * heads * kv
    dense, sparse = 2 * d * ff, experts * 2 * d * ff + d * experts
    mlps = (layers // 2) * dense + (layers // 2) * sparse
    encoder = layers * (attention + 2 * d) + mlps + d + buckets * heads
    decoder = layers * (2 * attention + 3 * d) + mlps + d + buckets * heads
    return vocab * d + encoder + decoder  # the embedding is the output head too


@pytest.mark.parametrize("gin_file,experts,published", [
    ("models/switch/base_8.gin", 8, 619_339_008),
    ("models/switch/base_128.gin", 128, 7_415_217_408)])
def test_switch_parameter_counts(gin_file, experts, published):
    from t5lite.config import parsing
    from t5lite.tools import footprint
    parsing.parse_gin([gin_file], [])
    model = parsing.resolve_macro("MODEL")
    params = footprint.abstract_params(model)
    assert footprint.param_count(params) == published == _switch_by_hand(
        768, 3072, 12, 12, 64, 32128, experts)
    # active a token: the router and one expert in each sparse layer
    assert footprint.active_param_count(model, params) == _switch_by_hand(
        768, 3072, 12, 12, 64, 32128, 1) - 12 * 768 * 1 + 12 * 768 * experts
    if experts == 8:  # transformers' own count, without allocating (meta tensors)
        config = transformers.SwitchTransformersConfig(
            d_model=768, d_ff=3072, d_kv=64, num_heads=12, num_layers=12,
            num_sparse_encoder_layers=6, num_sparse_decoder_layers=6, num_experts=8)
        with torch.device("meta"):
            theirs = transformers.SwitchTransformersForConditionalGeneration(config)
        assert theirs.num_parameters() == published


# ----------------------------------------------------------------------------- routing


def test_batch_prioritized_routing_matches_hand_dispatch():
    """Top-1 with T5X's batch priority: the group's tokens take slots in order of their
    router probability, the most confident first; the rest are dropped."""
    rng = np.random.default_rng(0)
    logits_ = rng.normal(size=(2, 16, 4)).astype(np.float32)
    logits_[..., 1] += 1.5  # expert 1 popular: its slots run out
    probs = np.asarray(jax.nn.softmax(logits_, axis=-1))
    capacity = routing.expert_capacity(16, 4, 0.75, "t5x")
    assert capacity == 4  # max(round(3.0), 4)
    got = routing.capacity_routing(probs, 1, capacity, batch_prioritized=True)
    slot, kept = np.asarray(got.slot)[..., 0], np.asarray(got.kept)[..., 0]
    for g in range(2):
        count = [0] * 4
        for s in sorted(range(16), key=lambda t: (-probs[g, t].max(), t)):
            e = int(np.argmax(probs[g, s]))
            want = e * capacity + count[e] if count[e] < capacity else 4 * capacity
            count[e] += 1
            assert slot[g, s] == want and kept[g, s] == (want < 4 * capacity), (g, s)
    assert 0 < kept.mean() < 1
    np.testing.assert_allclose(np.asarray(got.gates)[..., 0], np.where(
        kept, probs.max(-1), 0.0), rtol=1e-6)  # the raw probability, no renormalizing
    # token order (the decoder's) drops different tokens
    plain = routing.capacity_routing(probs, 1, capacity)
    assert not np.array_equal(np.asarray(plain.kept), np.asarray(got.kept))


def test_capacity_rules():
    assert routing.expert_capacity(4096, 8, 1.25, "t5x") == 640  # round(640.0)
    assert routing.expert_capacity(1000, 64, 1.25, "t5x") == 20  # round(19.53)
    assert routing.expert_capacity(1000, 64, 1.25, "gshard") == 20  # int(19.53) = 19, to 20
    assert routing.expert_capacity(100, 64, 1.25, "t5x") == 4  # at least 4


def test_batch_priority_is_for_encoders_only():
    with pytest.raises(ValueError, match="for an encoder only") as e:
        DecoderConfig(num_experts=4, batch_prioritized_routing=True)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="CAPACITY_RULE"):
        T5Config(num_experts=4, capacity_rule="floor")


# ----------------------------------------------------------------------------- HF


@pytest.fixture(scope="module")
def switch(tmp_path_factory):
    """(HF model, its logits on t5_batch(0), saved dir, config.json, tensors)."""
    torch.manual_seed(5)
    model = transformers.SwitchTransformersForConditionalGeneration(
        transformers.SwitchTransformersConfig(**DIMS)).eval()
    far_from_init(model)  # so the experts and routers matter
    path = tmp_path_factory.mktemp("switch")
    model.save_pretrained(str(path))
    config = json.loads((path / "config.json").read_text())
    return model, hf_t5_logits(model, t5_batch(0)), path, config, load_file(path / WEIGHTS)


def _no_drops(model):
    """The same model with room for every token (transformers' expert_capacity of 64 a
    sequence does not bind on these batches; t5lite's eval capacity then must not)."""
    return EncoderDecoderModel(dataclasses.replace(model.config,
                                                   eval_capacity_factor=float(EXPERTS)))


def test_switch_logits_match_transformers(switch):
    _, reference, path, _, _ = switch
    model, variables = hf.load_pretrained(path, dtype="float32")
    c = model.config
    assert (c.num_experts, c.moe_top_k, c.moe_every, c.moe_first, c.expert_mlp) == \
        (EXPERTS, 1, 2, 1, "relu")
    assert (c.capacity_rule, c.batch_prioritized_routing, c.logits_via_embedding) == \
        ("t5x", True, True)
    assert (c.router_aux_loss, c.router_z_loss) == (0.02, 0.003)
    params = variables["params"]
    assert params["encoder"]["layers_3"]["mlp"]["wi"]["kernel"].shape == (EXPERTS, 32, 48)
    assert "router" not in params["decoder"]["layers_2"]["mlp"]  # even layers dense
    batch = t5_batch(0)
    assert max_diff(logits(_no_drops(model), variables, batch), reference, batch) < TOL
    # an expert's kernels matter: swap two experts of one layer and the logits move
    wi = params["decoder"]["layers_1"]["mlp"]["wi"]["kernel"]
    swapped = jax.tree.map(lambda a: a, variables)
    swapped["params"]["decoder"]["layers_1"]["mlp"]["wi"]["kernel"] = wi[::-1]
    assert max_diff(logits(_no_drops(model), swapped, batch), reference, batch) > 100 * TOL


def test_switch_routes_as_transformers_with_the_settings_its_load_names(tmp_path, caplog):
    """transformers' capacity binding (expert_capacity 3 a sequence, sequences of 24 and
    40 tokens over 4 experts): with T5X's routing, the t5lite default, the logits differ;
    with the settings the load names in its one line (each sequence a group, its
    expert_capacity, tokens in order), they are transformers' within TOL."""
    torch.manual_seed(6)
    hf_model = transformers.SwitchTransformersForConditionalGeneration(
        transformers.SwitchTransformersConfig(**{**DIMS, "expert_capacity": 3})).eval()
    far_from_init(hf_model)
    hf_model.save_pretrained(str(tmp_path))
    batch = t5_batch(0)
    reference = hf_t5_logits(hf_model, batch)
    with caplog.at_level(logging.INFO, logger="t5lite.interop.hf_switch"):
        model, variables = hf.load_pretrained(tmp_path, dtype="float32")
    said = [r.getMessage() for r in caplog.records if "transformers' own numbers" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0], said
    settings = {"MOE_GROUP_SIZE": "'sequence'", "EXPERT_CAPACITY": "3",
                "BATCH_PRIORITIZED_ROUTING": "False"}
    for macro, value in settings.items():
        assert f"--gin.{macro}={value}" in said[0], said[0]
    assert max_diff(logits(model, variables, batch), reference, batch) > 100 * TOL
    as_transformers = EncoderDecoderModel(dataclasses.replace(
        model.config, moe_group_size="sequence", expert_capacity=3,
        batch_prioritized_routing=False))
    assert max_diff(logits(as_transformers, variables, batch), reference, batch) < TOL
    # and it does bind: room for every token gives other logits again
    roomy = EncoderDecoderModel(dataclasses.replace(as_transformers.config, expert_capacity=64))
    assert max_diff(logits(roomy, variables, batch), reference, batch) > 100 * TOL
    out = hf.save_pretrained(as_transformers, variables, tmp_path / "back")
    assert json.loads((out / "config.json").read_text())["expert_capacity"] == 3


def test_switch_round_trip_is_exact(switch, tmp_path):
    hf_model, reference, path, config, state = switch
    model, variables = hf.load_pretrained(path)
    out = hf.save_pretrained(model, variables, tmp_path / "out")
    written = load_file(out / WEIGHTS)
    assert written.keys() == {k for k in state if k not in (
        "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")}
    for name, a in written.items():
        np.testing.assert_array_equal(a, state[name], err_msg=name)
    back_cfg = json.loads((out / "config.json").read_text())
    for key in ("model_type", "num_experts", "num_sparse_encoder_layers",
                "num_sparse_decoder_layers", "d_ff", "router_aux_loss_coef", "dense_act_fn"):
        assert back_cfg[key] == config[key], key
    back = transformers.SwitchTransformersForConditionalGeneration.from_pretrained(
        str(out)).eval()
    batch = t5_batch(0)
    assert max_diff(hf_t5_logits(back, batch), reference, batch) == 0.0


def test_a_missing_expert_is_one_line(switch, tmp_path):
    _, _, _, config, state = switch
    broken = {k: v for k, v in state.items()
              if k != "encoder.block.1.layer.1.mlp.experts.expert_2.wo.weight"}
    path = tmp_path / "broken"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    save_file(broken, str(path / WEIGHTS), metadata={"format": "pt"})
    with pytest.raises(ValueError) as e:
        hf.load_pretrained(path)
    text = str(e.value)
    assert "\n" not in text and "encoder.block.1.layer.1.mlp.experts" in text
    assert "num_experts is 4" in text


@pytest.mark.parametrize("change,needle", [
    (dict(moe_top_k=2), "MOE_TOP_K=2"),
    (dict(expert_mlp="gelu"), "EXPERT_MLP='gelu'"),
    (dict(moe_first=0), "sparse layers [0, 2]")])
def test_what_transformers_switch_cannot_hold_is_one_line(switch, tmp_path, change, needle):
    model, variables = hf.load_pretrained(switch[2])
    other = EncoderDecoderModel(dataclasses.replace(model.config, **change))
    with pytest.raises(ValueError) as e:
        hf.save_pretrained(other, variables, tmp_path / "out")
    assert "\n" not in str(e.value) and needle in str(e.value), str(e.value)
    assert not (tmp_path / "out" / WEIGHTS).exists()


# ----------------------------------------------------------------------------- training


def test_a_tiny_switch_trains_with_both_stacks_statistics(switch):
    """A loss step of the tiny Switch (dropout rng on, training capacity 1.25, so tokens
    drop): the routers' statistics name each stack's sparse layers, and the load-balancing
    loss reaches the routers of both stacks."""
    model, variables = hf.load_pretrained(switch[2], dtype="float32")
    batch = t5_batch(1)

    def aux(params):  # the routers' objective, and the step's loss and metrics beside it
        loss, metrics = model.loss_fn(params, batch, jax.random.PRNGKey(0))
        return metrics["moe/objective"], (loss, metrics)

    # one compiled program (op by op, the loss and its gradient took 30 s on CPU)
    grads, (loss, metrics) = jax.jit(jax.grad(aux, has_aux=True))(variables)
    names = sorted(k for k in metrics if k.startswith("moe/dropped_fraction/"))
    assert names == [f"moe/dropped_fraction/{s}/layer_{i}" for s in ("decoder", "encoder")
                     for i in (1, 3)]
    assert np.isfinite(float(loss)) and 0 < float(metrics["moe/dropped_fraction"]) < 1
    grads = grads["params"]
    for stack in ("encoder", "decoder"):
        assert float(np.abs(grads[stack]["layers_3"]["mlp"]["router"]["kernel"]).sum()) > 0


def test_cli_from_hf_and_back(switch, tmp_path):
    """`t5lite.convert --from=hf` writes a model.gin with the experts' settings and a
    checkpoint; `--to=hf` of that checkpoint gives transformers' tensors back exactly."""
    from test_hf import convert_there_and_back
    _, _, path, _, state = switch
    text, written = convert_there_and_back(path, tmp_path)
    # the experts' settings as the shared macros (set on the command line as with a shipped
    # model file: convert_there_and_back sets CAPACITY_FACTOR on it)
    for line in ("NUM_EXPERTS = 4", "MOE_FIRST = 1", "CAPACITY_RULE = 't5x'",
                 "BATCH_PRIORITIZED_ROUTING = True", "T5Config.num_experts = %NUM_EXPERTS",
                 "T5Config.batch_prioritized_routing = %BATCH_PRIORITIZED_ROUTING"):
        assert line in text.splitlines(), line
    for name, a in written.items():
        np.testing.assert_array_equal(a, state[name], err_msg=name)
    assert "encoder.block.3.layer.1.mlp.experts.expert_3.wo.weight" in written


def test_a_converted_switch_trains_with_the_moe_macros_set(switch, tmp_path, capsys):
    """The converted model.gin takes the documented macros (docs/moe.md): a run from the
    converted checkpoint with --gin.CAPACITY_FACTOR=1.5 and a switch (SCAN_LAYERS: the
    converted per-layer checkpoint is restored into scanned stacks) trains (in two
    microbatches, which change its routing: one warning line), and its config.gin
    records both (before, the converted file wrote the MoE fields as values and the run
    ended with "the gin files define no macro CAPACITY_FACTOR"). SCAN_LAYERS, not
    REMAT_POLICY='full' as first written: the same proof, its step compiled in 7.5 s
    instead of 12.8 (the remat policies' own tests are test_switches')."""
    from t5lite import convert, train
    ckpt, run = tmp_path / "ckpt", tmp_path / "run"
    assert convert.main(["--from=hf", f"--input={switch[2]}", f"--output={ckpt}",
                         "--dtype=float32"]) == 0
    code = train.main([f"--gin_file={ckpt}/model.gin", "--gin_file=configs/synthetic_pretrain.gin",
                       f'--gin.MODEL_DIR="{run}"', f'--gin.INITIAL_CHECKPOINT_PATH="{ckpt}"',
                       "--gin.TRAIN_STEPS=1", "--gin.BATCH_SIZE=16",
                       "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
                       "--gin.CheckpointSettings.async_save=False",
                       "--gin.CAPACITY_FACTOR=1.5", "--gin.SCAN_LAYERS=True",
                       "--gin.NUM_MICROBATCHES=2"])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    # microbatches of 8 x 16 encoder tokens hold half a routing group of the whole batch:
    # the start-up line says so, once
    said = [l for l in err.splitlines() if "changes the mixture-of-experts routing" in l]
    assert len(said) == 1, err[-3000:]
    assert "NUM_MICROBATCHES=2" in said[0] and "MOE_GROUP_SIZE" in said[0], said[0]
    config = (run / "config.gin").read_text().splitlines()
    assert "CAPACITY_FACTOR = 1.5" in config and "SCAN_LAYERS = True" in config
    assert "T5Config.capacity_factor = %CAPACITY_FACTOR" in config


# ----------------------------------------------------------------------------- T5X MoE


def test_a_t5x_moe_checkpoint_restores_with_its_factored_adafactor_state(switch, tmp_path):
    """T5X's contrib/moe layout (written in the test, as T5X writes it): the parameters
    restore bit for bit as INITIAL_CHECKPOINT_PATH, and Adafactor's state continues, the
    expert kernels' moments factored per expert (v_row [experts, embed], v_col
    [experts, mlp], T5X's factor rules)."""
    import t5x_helpers as tx
    from t5lite.formats import t5x_checkpoint, t5x_optimizer_state
    from t5lite.models.common import param_paths
    from t5lite.optim import optimizers
    from t5lite.runtime.checkpointing import finetune_restore
    model, variables = hf.load_pretrained(switch[2], dtype="float32")
    view = tx.t5x_moe_view(variables["params"])
    assert "encoder/layers_1/mlp/expert/wi/kernel" in view
    rng = np.random.default_rng(0)
    slots = {}
    for name, value in view.items():
        zero = np.zeros((1,), np.float32)
        if value.ndim < 3:  # T5X's heuristic, at the run's min_dim_size_to_factor of 16
            dims = tx.t5x_factored_dims(value.shape, 16)
            slots[name] = {"m": zero, "v": rng.uniform(0.5, 2, value.shape).astype(
                np.float32) if dims is None else zero}
            slots[name]["v_row"] = zero if dims is None else rng.uniform(
                0.5, 2, value.shape[dims[0]]).astype(np.float32)
            slots[name]["v_col"] = zero if dims is None else rng.uniform(
                0.5, 2, value.shape[dims[1]]).astype(np.float32)
        else:  # T5X: expert a batch axis, embed the row, mlp the column
            e, d_in, d_out = value.shape
            embed, mlp = (d_in, d_out) if "/wi/" in name else (d_out, d_in)
            slots[name] = {"v_row": rng.uniform(0.5, 2, (e, embed)).astype(np.float32),
                           "v_col": rng.uniform(0.5, 2, (e, mlp)).astype(np.float32),
                           "v": np.zeros((1,), np.float32), "m": np.zeros((1,), np.float32)}
    ckpt = tx.write_t5x_checkpoint(tmp_path / "checkpoint_7", param_paths.unflatten(view),
                                   step=7, param_states=tx.param_states(slots))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = model.abstract_variables()["params"]
    restored = finetune_restore.restore_params_for_finetuning(ckpt, model, {
        "params": jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                               sharding=device), abstract)})
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored["params"]),
                 jax.tree.map(np.asarray, variables["params"]))
    opt = optimizers.adafactor(0.1, min_dim_size_to_factor=16)
    txf = opt.transformation(model.logical_axes()["params"])
    state = t5x_optimizer_state.opt_state_from_t5x(
        t5x_checkpoint.read_checkpoint(ckpt)["state"], model,
        jax.eval_shape(txf.init, abstract), opt.factoring, "test")
    factored = [s for s in jax.tree_util.tree_leaves(state, is_leaf=lambda x: hasattr(
        x, "v_row")) if hasattr(s, "v_row")][0]
    for stack in ("encoder", "decoder"):
        for w in ("wi", "wo"):
            name = f"{stack}/layers_3/mlp/expert/{w}/kernel"
            ours = factored.v_row[stack]["layers_3"]["mlp"][w]["kernel"]
            np.testing.assert_array_equal(ours, slots[name]["v_row"])
            np.testing.assert_array_equal(
                factored.v_col[stack]["layers_3"]["mlp"][w]["kernel"], slots[name]["v_col"])
    assert int(factored.count) == 7


def test_a_switch_checkpoint_into_a_dense_model_is_one_line(switch, tmp_path):
    import t5x_helpers as tx
    from t5lite.errors import CheckpointMismatchError
    from t5lite.models.common import param_paths
    from t5lite.runtime.checkpointing import finetune_restore
    model, variables = hf.load_pretrained(switch[2], dtype="float32")
    ckpt = tx.write_t5x_checkpoint(tmp_path / "checkpoint_1", param_paths.unflatten(
        tx.t5x_moe_view(variables["params"])))
    dense = EncoderDecoderModel(dataclasses.replace(model.config, num_experts=0))
    with pytest.raises(CheckpointMismatchError) as e:
        finetune_restore.restore_params_for_finetuning(
            ckpt, dense, {"params": dense.abstract_variables()["params"]})
    assert "\n" not in str(e.value) and "mixture of experts" in str(e.value)


# ----------------------------------------------------------------------------- upcycling

DENSE = T5Config(vocab_size=VOCAB, emb_dim=32, num_heads=4, head_dim=8, num_encoder_layers=4,
                 num_decoder_layers=4, mlp_dim=48, dtype="float32")  # T5 v1.1: gated GELU
UPCYCLED = dataclasses.replace(DENSE, num_experts=4, moe_every=2, moe_first=1, moe_top_k=2,
                               expert_mlp="geglu", capacity_factor=4.0,
                               eval_capacity_factor=4.0, moe_group_size=64)


@pytest.fixture(scope="module")
def dense_checkpoint(tmp_path_factory):
    """A dense tiny T5 v1.1 (random weights) saved as a t5lite checkpoint: (dir, params)."""
    from test_hf import random_variables
    from t5lite.interop import checkpoint_format
    model = EncoderDecoderModel(DENSE)
    variables = random_variables(model, 7)
    path = tmp_path_factory.mktemp("dense")
    checkpoint_format.save_params(path, variables)
    return path, variables


def _upcycle(path, cfg):
    """(model, upcycled params, the fresh params the routers came from). The fresh
    parameters (random, as test_hf.random_variables draws them: a `model.init` compiled
    a program for each config, 5-7 s of CPU op by op) are drawn only when
    restore_upcycled asks for them (a refused upcycling never does)."""
    from test_hf import random_variables
    from t5lite.runtime.checkpointing import upcycle
    model = EncoderDecoderModel(cfg)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = {"params": jax.tree.map(lambda a: jax.ShapeDtypeStruct(
        a.shape, a.dtype, sharding=device), model.abstract_variables()["params"])}
    drawn = []

    def fresh():
        if not drawn:
            drawn.append(random_variables(model, 3))
        return drawn[0]

    params = upcycle.restore_upcycled(path, model, abstract, fresh)
    assert drawn  # the routers came from the fresh init
    return model, params, drawn[0]


@pytest.mark.parametrize("layout", [{}, {"fuse_qkv": True}])
def test_upcycled_top2_model_starts_with_the_dense_logits(dense_checkpoint, layout):
    """INITIAL_CHECKPOINT_STATE='upcycle': every expert a copy of its layer's dense MLP,
    the routers the run's fresh ones; with top-2's renormalized gates (and capacity for
    every token) the first logits are the dense model's (1e-5)."""
    path, variables = dense_checkpoint
    model, params, fresh = _upcycle(path, dataclasses.replace(UPCYCLED, **layout))
    p = jax.device_get(params["params"])
    dense_mlp = variables["params"]["encoder"]["layers_1"]["mlp"]
    for w in ("wi_0", "wi_1", "wo"):
        for e in range(4):
            np.testing.assert_array_equal(p["encoder"]["layers_1"]["mlp"][w]["kernel"][e],
                                          dense_mlp[w]["kernel"])
    np.testing.assert_array_equal(p["decoder"]["layers_3"]["mlp"]["router"]["kernel"],
                                  fresh["params"]["decoder"]["layers_3"]["mlp"]["router"]["kernel"])
    np.testing.assert_array_equal(p["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"],
                                  variables["params"]["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"])
    batch = t5_batch(2)
    reference = logits(EncoderDecoderModel(DENSE), variables, batch)
    assert max_diff(logits(model, params, batch), reference, batch) < 1e-5


def test_upcycled_switch_top1_starts_scaled(dense_checkpoint):
    """Top-1 (Switch) weights an expert by its raw router probability: the upcycled
    model's first logits are not the dense model's (docs/moe.md says so)."""
    path, variables = dense_checkpoint
    model, params, _ = _upcycle(path, dataclasses.replace(UPCYCLED, moe_top_k=1))
    batch = t5_batch(2)
    reference = logits(EncoderDecoderModel(DENSE), variables, batch)
    assert max_diff(logits(model, params, batch), reference, batch) > 1e-3


def test_upcycling_what_cannot_be_is_one_line(dense_checkpoint):
    from t5lite.errors import CheckpointMismatchError, ConfigError
    path, _ = dense_checkpoint
    cases = [(DENSE, ConfigError, "the model has none"),
             (dataclasses.replace(UPCYCLED, expert_mlp="relu"), ConfigError, "EXPERT_MLP='relu'"),
             (dataclasses.replace(UPCYCLED, mlp_dim=64), CheckpointMismatchError,
              "does not match the model")]
    for cfg, error, needle in cases:
        with pytest.raises(error) as e:
            _upcycle(path, cfg)
        assert "\n" not in str(e.value) and needle in str(e.value), str(e.value)


def test_expert_dropout_is_its_own_rate(switch):
    """EXPERT_DROPOUT_RATE (T5X's Switch finetuning habit): dropout in the experts alone,
    DROPOUT_RATE 0 elsewhere; None follows DROPOUT_RATE."""
    model, variables = hf.load_pretrained(switch[2], dtype="float32")
    batch, rng = t5_batch(1), jax.random.PRNGKey(4)

    def loss(**changes):
        m = EncoderDecoderModel(dataclasses.replace(model.config, dropout_rate=0.0,
                                                    capacity_factor=4.0,
                                                    eval_capacity_factor=4.0, **changes))
        loss_fn = jax.jit(m.loss_fn)  # jitted: op by op, each primitive compiled a program
        return float(loss_fn(variables, batch, rng)[0]), float(loss_fn(variables, batch)[0])

    trained, evaluated = loss()
    assert trained == pytest.approx(evaluated, rel=1e-6)  # no dropout anywhere
    trained, evaluated = loss(expert_dropout_rate=0.4)
    assert abs(trained - evaluated) > 1e-3 * abs(evaluated)
    with pytest.raises(ValueError, match="EXPERT_DROPOUT_RATE"):
        dataclasses.replace(model.config, expert_dropout_rate=1.0)


def test_decoding_a_switch_with_its_cache_gives_the_full_forward_argmax(switch):
    """Inference decodes a token at a time (each step's tokens one routing group, the KV
    cache in the decoder): with room for every choice, greedy decoding gives, token for
    token, the argmax of the full forward pass over the decoded prefix (what eval
    scores): eval and infer see the same model."""
    import jax.numpy as jnp
    model, variables = hf.load_pretrained(switch[2], dtype="float32")
    model = EncoderDecoderModel(dataclasses.replace(model.config, eval_capacity_factor=4.0))
    batch = t5_batch(3, enc_len=12, dec_len=8, enc_valid=(12, 7, 9), dec_valid=(8, 8, 8))
    # jitted: op by op, each primitive of the decoding loop compiled a program of its own
    tokens = np.asarray(jax.jit(functools.partial(model.predict_batch, max_decode_length=8,
                                                  eos_id=None))(variables, batch))
    inputs = np.pad(tokens[:, :-1], ((0, 0), (1, 0)))
    full = logits(model, variables, {  # the full forward pass, compiled (test_hf.logits)
        "encoder_input_tokens": batch["encoder_input_tokens"],
        "decoder_input_tokens": inputs, "decoder_target_tokens": jnp.ones_like(inputs)})
    np.testing.assert_array_equal(np.argmax(full, -1), tokens)
    assert len(np.unique(tokens)) > 3  # not a constant answer


def test_the_switch_finetuning_recipe_binds_its_habits():
    from t5lite.config import parsing
    parsing.parse_gin(["models/switch/base_8.gin", "configs/finetune_switch_mnli.gin"],
                      ['INITIAL_CHECKPOINT_PATH = "/ckpt/switch"'], finalize=False)
    c = parsing.resolve_macro("MODEL").config
    assert (c.num_experts, c.moe_top_k, c.expert_dropout_rate, c.dropout_rate) == (8, 1, 0.4, 0.1)
    assert (c.capacity_factor, c.eval_capacity_factor, c.capacity_rule) == (1.25, 2.0, "t5x")
