"""t5lite: a compact T5X-style training system on JAX/Flax."""
import pathlib

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent

# The ranges are those tested (README.md, "Versions"): the whole suite on the newest
# releases (jax 0.12), and the GPU tools on the GPU image's jax 0.11.2
# (scripts_gpu/image_smoke.sh). jax 0.11 needs Python 3.12 or newer.
RUNTIME = [
    "jax>=0.11.2,<0.13",
    "flax>=0.12.12",
    "optax>=0.2.8",
    "orbax-checkpoint>=0.12.8",
    # T5X checkpoints' zarr arrays (t5lite/formats/t5x_checkpoint.py); flax and orbax
    # install it already, it is named because t5lite imports it itself.
    "tensorstore>=0.1.60",
    "gin-config>=0.5.0",
    "numpy>=2.5.2",
    "sentencepiece>=0.2.0",
    # Hugging Face tokenizer.json vocabularies (LLaMA-3's, Qwen's byte-level BPE;
    # t5lite/data/tokenizer_json.py); its huggingface-hub is never called (no network).
    "tokenizers>=0.15",
    "safetensors>=0.4",
    # TensorBoard: the event-file writer of the training loop, and the `tensorboard
    # --logdir MODEL_DIR` the run's closing line suggests.
    "tensorboard>=2.12",
    # The data edge. t5 pins seqio-nightly and tfds-nightly; the released seqio and
    # tensorflow-datasets are listed here so that they are the ones installed too, and
    # `python -m t5lite.deps` (t5lite/data/package_check.py) checks that they are what
    # imports.
    "seqio>=0.0.19",
    "tensorflow-datasets>=4.9.6",
    "t5>=0.9.4",
    # The Pile's own files are .jsonl.zst (t5lite/data/files/readers.py).
    "zstandard>=0.22",
    # FineWeb / DCLM-style Parquet shards (t5lite/data/files/parquet_cursor.py); the data edge
    # (datasets, tensorflow-datasets) installs it already.
    "pyarrow>=14",
    # etils.epath (under tensorflow-datasets) needs it to write or prepare a TFDS
    # dataset locally; tensorflow-datasets declares it only for Python < 3.9.
    "importlib_resources>=6.0",
    # The training bar on an interactive terminal (t5lite/runtime/metrics.py's Progress);
    # tensorflow-datasets installs it already, it is named because t5lite imports it itself.
    "tqdm>=4.60",
]

# Compiling for an H100 / H200 on a machine without a GPU (`python -m t5lite.info
# --gpu=h200`, t5lite/tools/gpu_target.py): jax's CUDA plugin and PJRT of jax's own
# version (cuda13-local: the plugin without NVIDIA's runtime libraries), ptxas (nvcc) and
# libdevice (nvvm) for the kernels, cuDNN for the fused attention's trace. About 1.5 GB;
# the test extra includes it, so CI compiles the tiny models for a GPU.
GPU_AOT = [
    "jax[cuda13-local]>=0.11.2,<0.13",
    "nvidia-cuda-nvcc>=13.0.48",
    "nvidia-nvvm>=13.0.48",
    "nvidia-cudnn-cu13>=9.12,<10",
]

PLOT = ["matplotlib>=3.8"]

setup(
    name="t5lite",
    version="0.1.0",
    description="T5X-style training of T5 v1.1, GPT and LLaMA models in JAX/Flax, small and fast.",
    long_description=(HERE / "README.md").read_text() if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.12",
    # The repo keeps gin files in top-level configs/; a wheel ships them as the data
    # package t5lite/configs (found by t5lite.config.parsing.shipped_configs_dir). An editable
    # install keeps using configs/ in the checkout.
    packages=find_packages(include=["t5lite", "t5lite.*"]) + ["t5lite.configs"],
    package_dir={"t5lite.configs": "configs"},
    include_package_data=True,
    # the step-time predictor's calibration (t5lite/tools/gpu_calibration.json)
    package_data={"t5lite.configs": ["*.gin", "**/*.gin"], "t5lite.tools": ["*.json"]},
    install_requires=RUNTIME,
    extras_require={
        "test": [
            "pytest>=7",
            "pytest-xdist>=3.5",  # the README's test command runs the files on every core
            "pytest-timeout>=2.2",  # pytest.ini: a test that hangs fails, naming itself
            "torch==2.13.0",
            "transformers>=4.40",
            "safetensors>=0.4",
        ] + GPU_AOT + PLOT,
        "gpu-aot": GPU_AOT,
        # `python -m t5lite.plot`: runs' curves drawn into a PNG / SVG / PDF.
        "plot": PLOT,
        "gpu": ["jax[cuda13]>=0.11.2,<0.13"],
        # NVIDIA Transformer Engine for JAX (FP8_BACKEND='te', ATTENTION_IMPL='te'; needs an
        # NVIDIA GPU, CUDA and `pip install --no-build-isolation`): the metapackage's jax
        # extra pulls transformer_engine_jax and the CUDA core library of the same version;
        # make_dot_general_cls, which t5lite's Dense plugs in, exists from 2.12.
        "te": ["transformer_engine[jax]>=2.12"],
    },
)
