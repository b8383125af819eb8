"""Shipped gin configs, flag parsing, and one-line configuration errors."""
import json
import os
import sys
import time
from pathlib import Path

import jax
import pytest

from t5lite.config import flags, parsing
from t5lite.errors import ConfigError
from t5lite.models import configs
from t5lite.tools import footprint

import train_helpers as th

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
MODEL_CONFIGS = sorted(p for p in (CONFIGS / "models").rglob("*.gin")
                       if not p.name.startswith("_"))

EXPECTED_PARAMS = {
    "models/t5_1_1/small.gin": 76_961_152,
    "models/t5_1_1/base.gin": 247_577_856,
    "models/t5_1_1/large.gin": 783_150_080,
    "models/t5_1_1/xl.gin": 2_849_757_184,
    "models/t5_1_1/xxl.gin": 11_135_332_352,
    "models/llama2/7b.gin": 6_738_415_616,
    "models/llama2/13b.gin": 13_015_864_320,
    "models/llama2/70b.gin": 68_976_648_192,
    "models/llama3/8b.gin": 8_030_261_248,    # transformers' own counts (on meta tensors)
    "models/llama3/70b.gin": 70_553_706_496,
    "models/llama3/3_1_8b.gin": 8_030_261_248,
    "models/llama3/1b.gin": 1_235_814_400,     # LLaMA-3.2 1B, tied
    "models/mistral/7b.gin": 7_241_732_096,
    "models/qwen2_5/7b.gin": 7_615_616_512,
    "models/qwen2_5/0_5b.gin": 494_032_768,
    "models/qwen3/8b.gin": 8_190_735_360,
    "models/qwen3/0_6b.gin": 596_049_920,
}
SWITCH_DEFAULTS = {macro: configs.Switches.__dataclass_fields__[field].default
                   for field, macro in configs.switch_macros().items()}


def _model(gin_file, *bindings):
    parsing.parse_gin([gin_file], list(bindings))
    return parsing.resolve_macro("MODEL")


@pytest.mark.parametrize("path", sorted(CONFIGS.rglob("*.gin")), ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_config_parses(path):
    # Run configs may leave %gin.REQUIRED macros for the user, so no finalize here.
    parsing.parse_gin([str(path)], finalize=False)


@pytest.mark.parametrize("path", MODEL_CONFIGS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_model_configs_bind_model_and_switches(path):
    model = _model(str(path.relative_to(CONFIGS)))  # found through the shipped search path
    assert hasattr(model, "config")
    for name, default in SWITCH_DEFAULTS.items():
        value = parsing.gin.query_parameter(f"{name}/gin.macro.value")
        if not (path.name == "5b.gin" and name == "SCAN_LAYERS"):
            assert value == default, (path, name)  # the macro's value is the Python default
    for field, macro in configs.switch_macros().items():  # and the binding reaches the config
        assert getattr(model.config, field) == parsing.gin.query_parameter(
            f"{macro}/gin.macro.value"), (path, field)


@pytest.mark.parametrize("gin_file", list(EXPECTED_PARAMS))
def test_parameter_counts_via_eval_shape(gin_file):
    model = _model(gin_file)
    start = time.perf_counter()
    params = footprint.abstract_params(model)
    elapsed = time.perf_counter() - start
    leaves = jax.tree_util.tree_leaves(params)
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert footprint.param_count(params) == EXPECTED_PARAMS[gin_file]
    assert elapsed < 30, f"eval_shape took {elapsed:.1f}s: is something being allocated?"


def test_switch_macros_reach_the_config():
    default = _model("models/gpt/5b.gin").config
    assert default.scan_layers  # 5B scans by default
    cfg = _model("models/gpt/5b.gin", "SCAN_LAYERS = False", "FUSE_QKV = True",
                 "REMAT_POLICY = 'full'", "ATTENTION_IMPL = 'cudnn'").config
    assert (cfg.scan_layers, cfg.fuse_qkv, cfg.remat_policy, cfg.attention_impl) == (
        False, True, "full", "cudnn")
    assert _model("models/gpt/5b.gin", "DROPOUT_RATE = 0.1").config.dropout_rate == 0.1


@pytest.mark.parametrize("impl", ["cudnn", "dot_product"])
def test_an_attention_kernel_without_dropout_refuses_a_dropout_rate(impl):
    """jax.nn.dot_product_attention has no dropout: ATTENTION_IMPL cudnn / dot_product
    with DROPOUT_RATE > 0 would silently train without the attention weights' dropout."""
    with pytest.raises(Exception, match=rf"ATTENTION_IMPL='{impl}' applies no dropout.*"
                                        r"DROPOUT_RATE=0.0.*ATTENTION_IMPL='xla'"):
        _model("models/t5_1_1/tiny.gin", f"ATTENTION_IMPL = '{impl}'", "DROPOUT_RATE = 0.1")


def test_cudnn_attention_refuses_float32_activations():
    """cuDNN's fused attention runs in bf16 / fp16 only: float32 with it is one line
    before anything is traced (the launchers' fp32 switches the attention to xla)."""
    with pytest.raises(Exception, match=r"ATTENTION_IMPL='cudnn' runs in bfloat16 or "
                                        r"float16 only.*ATTENTION_IMPL='xla'"):
        _model("models/t5_1_1/tiny.gin", "ATTENTION_IMPL = 'cudnn'",
               "ACTIVATION_DTYPE = 'float32'")
    assert _model("models/t5_1_1/tiny.gin", "ATTENTION_IMPL = 'dot_product'",
                  "ACTIVATION_DTYPE = 'float32'").config.dtype == "float32"


def test_rewrite_gin_args_keeps_order():
    argv = ["--gin_file=a.gin", "--gin.BATCH_SIZE=8", "--gin_bindings=X = 1",
            "--gin.MODEL_DIR='/tmp/x=y'"]
    assert flags.rewrite_gin_args(argv) == [
        "--gin_file=a.gin", "--gin_bindings=BATCH_SIZE = 8", "--gin_bindings=X = 1",
        "--gin_bindings=MODEL_DIR = '/tmp/x=y'"]
    with pytest.raises(ConfigError, match="--gin.FOO"):
        flags.rewrite_gin_args(["--gin.FOO"])


def test_search_path_includes_cwd_and_configs(tmp_path):
    paths = parsing.search_paths(["/a,/b", "/c"])
    assert paths[0] == os.getcwd() and paths[1:4] == ["/a", "/b", "/c"]
    assert str(CONFIGS) in paths


def test_required_macro_is_reported_with_its_file(tmp_path):
    gin = tmp_path / "run.gin"
    gin.write_text("include 'models/t5_1_1/tiny.gin'\nMODEL_DIR = %gin.REQUIRED\n")
    with pytest.raises(ConfigError, match=r"MODEL_DIR .*run.gin:2"):
        parsing.parse_gin([str(gin)])
    parsing.parse_gin([str(gin)], ["MODEL_DIR = '/tmp/m'"])  # set: fine


# --------------------------------------------------------------------------- subprocess

def _info(*args, cwd=REPO):
    return th.run([sys.executable, "-m", "t5lite.info", *args], devices=8, cwd=cwd,
                  timeout=120)


T5_BASE = "configs/models/t5_1_1/base.gin"


def test_info_json_t5_base(info_mains):
    """(`info`'s main in the interpreter of `info_mains`; the next test runs the command as
    a process.)"""
    proc = info_mains[T5_BASE]
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["params"] == 247_577_856
    assert round(report["train_flops_per_example"] / 1e9) == 437
    assert report["param_bytes"] == 4 * 247_577_856
    assert report["total_bytes"] == report["param_bytes"] + report["optimizer_state_bytes"]
    assert "247,577,856" in proc.stderr  # the table


def test_info_json_llama_adamw_from_another_directory(tmp_path):
    proc = _info("--gin_file=models/llama2/7b.gin", "--optimizer=adamw", "--seq_length=4096",
                 "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["params"] == 6_738_415_616
    # two float32 moments per parameter, plus a few bytes of step counters
    assert 8 * 6_738_415_616 <= report["optimizer_state_bytes"] <= 8 * 6_738_415_616 + 64
    assert report["train_flops_per_example"] == 4096 * report["train_flops_per_token"]


def _write(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


ERROR_CASES = ["syntax", "unknown_configurable", "unknown_parameter", "missing_file",
               "missing_include", "required", "bad_flag_binding", "rope_scaling",
               "sliding_window"]
REAL_PROCESS_CASE = "syntax"  # `python -m t5lite.info` itself; the others share a process
RUN_CONFIGS = [
    ("configs/large_pile_pretrain.gin", "models/t5_1_1/large.gin"),
    ("configs/llama2_7b_pile_pretrain.gin", "models/llama2/7b.gin"),
    ("configs/large_text_pretrain.gin", "models/t5_1_1/large.gin"),
    ("configs/llama2_7b_text_pretrain.gin", "models/llama2/7b.gin"),
]


def _error_case(tmp_path, case):
    """(info's argv, the words its one error line holds) of an ERROR_CASES case."""
    tiny = "include 'models/t5_1_1/tiny.gin'\n"
    args, expect = {
        "syntax": ([_write(tmp_path, "typo.gin", tiny + "T5Config.emb_dim = = 3\n")],
                   ["typo.gin:2", "syntax"]),
        "unknown_configurable": ([_write(tmp_path, "u.gin", tiny + "T5Confg.emb_dim = 3\n")],
                                 ["T5Confg", "u.gin:2"]),
        "unknown_parameter": ([_write(tmp_path, "p.gin", tiny + "T5Config.emb_dimm = 3\n")],
                              ["emb_dimm", "p.gin:2"]),
        "missing_file": (["nope/missing.gin"], ["nope/missing.gin", "not found"]),
        "missing_include": ([_write(tmp_path, "i.gin", "include 'models/t5_1_1/tinyy.gin'\n")],
                            ["models/t5_1_1/tinyy.gin", "i.gin:1"]),
        "required": ([_write(tmp_path, "r.gin", tiny + "BATCH_SIZE = %gin.REQUIRED\n")],
                     ["BATCH_SIZE", "r.gin:2"]),
        "bad_flag_binding": (["models/t5_1_1/tiny.gin", "--gin.REMAT_POLICY=full"],
                             ["REMAT_POLICY", "quotes"]),
        "rope_scaling": (["models/llama3/tiny.gin", "--gin.DecoderConfig.rope_scaling='yarn'"],
                         ["rope_scaling", "'yarn'", "llama3"]),
        "sliding_window": ([_write(tmp_path, "w.gin", "include 'models/mistral/tiny.gin'\n"
                                   "ATTENTION_IMPL = 'te'\n")], ["sliding_window", "'te'"]),
    }[case]
    return [a if a.startswith("--") else f"--gin_file={a}" for a in args], expect


@pytest.fixture(scope="module")
def info_mains(tmp_path_factory):
    """{error case or config: its CompletedProcess}: `t5lite.info`'s main run on each
    error case but REAL_PROCESS_CASE, on T5_BASE and on each RUN_CONFIGS run config
    (`--json`), in one fresh interpreter (th.run_mains: what `python -m` would exit with,
    and print), so the imports are paid once."""
    root = tmp_path_factory.mktemp("info_mains")
    names = ([c for c in ERROR_CASES if c != REAL_PROCESS_CASE] + [T5_BASE] +
             [r for r, _ in RUN_CONFIGS])
    argvs = []
    for name in names:
        if name in ERROR_CASES:
            (root / name).mkdir()
            argvs.append(_error_case(root / name, name)[0])
        else:
            argvs.append([f"--gin_file={name}", "--json"])
    return dict(zip(names, th.run_mains(argvs, module="t5lite.info", cwd=REPO)))


@pytest.mark.parametrize("case", ERROR_CASES)
def test_config_errors_are_one_line(tmp_path, case, info_mains):
    argv, expect = _error_case(tmp_path, case)
    proc = _info(*argv) if case == REAL_PROCESS_CASE else info_mains[case]
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for word in expect:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize("run_config,model_config", RUN_CONFIGS)
def test_shipped_run_configs_bind_their_model(run_config, model_config, info_mains):
    """A shipped run config parses completely (its run macros REQUIRED) and builds the
    model of its size; `info` reads it without MODEL_DIR (its main, in the interpreter
    of `info_mains`; test_info_json_* run the command as a process)."""
    proc = info_mains[run_config]
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["params"] == EXPECTED_PARAMS[model_config]


@pytest.mark.parametrize("text,line,shown", [
    ("MODEL_DIR = '/tmp/q'\nICI_MESH_SHAPE = [1, 1,\n   1\n", 2, "ICI_MESH_SHAPE = [1, 1,"),
    ("a = 1\nb = '''never\n\nc = 2\n", 2, "b = '''never"),
], ids=["bracket", "triple_quote"])
def test_a_gin_file_left_open_names_the_line_that_opens(tmp_path, text, line, shown):
    path = tmp_path / "open.gin"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        parsing.parse_gin([str(path)], finalize=False)
    assert str(e.value) == (f"gin syntax error: a bracket or quote opened here is never "
                            f"closed at {path}:{line}: {shown}")


@pytest.mark.parametrize("kwargs,needle", [
    (dict(eos_id=0), "padding id"), (dict(eos_id=32000), "eos_id must be a token id"),
    (dict(bos_id=-1), "bos_id must be a token id"), (dict(bos_id=True), "bos_id")])
def test_special_ids_must_be_token_ids(kwargs, needle):
    from t5lite.models.configs import DecoderConfig
    with pytest.raises(ValueError, match=needle):
        DecoderConfig(**kwargs)

