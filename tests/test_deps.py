"""The data edge imports the released seqio / tensorflow-datasets (not the nightlies the
t5 package pins), and the model library never imports TensorFlow, SeqIO, t5 or clu."""
import importlib.metadata as metadata
import json
import subprocess
import sys

from t5lite.data import package_check

import train_helpers as th


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_released_seqio_and_tfds_are_what_import():
    got = json.loads(_run(
        "import json, seqio, tensorflow_datasets as tfds;"
        "print(json.dumps([seqio.__version__, tfds.__version__]))"))
    assert got == [metadata.version("seqio"), metadata.version("tensorflow-datasets")]
    assert "dev" not in got[0] and "dev" not in got[1]
    assert package_check.problems() == []


def test_shadowing_nightly_is_detected(tmp_path):
    (tmp_path / "seqio").mkdir()
    (tmp_path / "seqio" / "version.py").write_text("__version__ = '0.0.18.dev20250227'\n")
    (tmp_path / "tensorflow_datasets").mkdir()
    (tmp_path / "tensorflow_datasets" / "version.py").write_text(
        "_MAJOR_VERSION = '4'\n_MINOR_VERSION = '9'\n_PATCH_VERSION = '2.dev202308090034'\n"
        "__version__ = '.'.join([_MAJOR_VERSION, _MINOR_VERSION, _PATCH_VERSION])\n")
    found = package_check.problems(search_path=[str(tmp_path)])
    assert [(m, d) for m, d, _ in found] == [("seqio", "seqio"),
                                            ("tensorflow_datasets", "tensorflow-datasets")]


def test_model_library_imports_no_tensorflow_seqio_t5_or_clu():
    code = (
        "import t5lite.models.model, t5lite.models.layouts, t5lite.models.common.losses\n"
        "import t5lite.models.flops, t5lite.interop.hf, t5lite.interop.checkpoint_format\n"
        "import jax, jax.numpy as jnp\n"
        "from t5lite.models.configs import T5Config\n"
        "m = t5lite.models.model.EncoderDecoderModel(T5Config(vocab_size=64, emb_dim=16,"
        " num_heads=2, head_dim=8, num_encoder_layers=1, num_decoder_layers=1, mlp_dim=32,"
        " fp8=True))\n"
        "v = m.init(jax.random.PRNGKey(0))\n")
    _, imported = th.imports_after(code)
    assert imported == []
