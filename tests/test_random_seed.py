"""RANDOM_SEED=None, as T5X's GPU recipes set it: a seed drawn at the run's start, logged
and kept in MODEL_DIR/random_seed.json, so that the run resumes exactly as an integer
seed's run does; every process of a run gets process 0's draw.

The training runs go through `train.main`, several in one interpreter (th.run_mains), on
the tiny T5 cut to one layer a side and a 512-entry vocabulary."""
import json
import re
import sys

import numpy as np
import pytest

import train_helpers as th

SEED_LINE = re.compile(r"RANDOM_SEED=None: drew seed (\d+) for this run, kept in (\S+)")
# dropout on, so that the seed reaches initialization, dropout and the data order
COMMON = ("--gin.T5Config.vocab_size=512", "--gin.T5Config.num_encoder_layers=1",
          "--gin.T5Config.num_decoder_layers=1", "--gin.RANDOM_SEED=None",
          "--gin.DROPOUT_RATE=0.1", "--gin.CHECKPOINT_PERIOD=2", "--gin.LOG_PERIOD=2")


def _params(model_dir, step):
    return th.flat(th.load_state(model_dir, step)["params"])


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """In one interpreter: a run that draws its seed (2 steps) and its resume (to 4), and
    a run whose random_seed.json is damaged. {name: (MODEL_DIR, the run)}."""
    root = tmp_path_factory.mktemp("drawn")
    damaged = root / "damaged"
    damaged.mkdir()
    (damaged / "random_seed.json").write_text("{\"random_seed\": -3}\n")
    runs = [("first", root / "drawn", 2), ("resumed", root / "drawn", 4),
            ("damaged", damaged, 2)]
    procs = th.run_mains([th.train_command(model_dir, *COMMON, steps=steps)[3:]
                          for _, model_dir, steps in runs])
    return {name: (model_dir, proc) for (name, model_dir, _), proc in zip(runs, procs)}


def test_a_drawn_seed_is_kept_and_a_resume_continues_exactly(drawn, tmp_path):
    (run_dir, first), (_, resumed) = drawn["first"], drawn["resumed"]
    assert first.returncode == 0, th.describe(first)
    match = SEED_LINE.search(first.stderr)
    assert match, th.tail(first.stderr)
    seed = int(match.group(1))
    assert json.loads((run_dir / "random_seed.json").read_text()) == {"random_seed": seed}

    assert resumed.returncode == 0, th.describe(resumed)
    assert f"RANDOM_SEED=None: this run's seed is {seed}, drawn at its start" in resumed.stderr
    assert not SEED_LINE.search(resumed.stderr)

    # the same seed given as an integer, uninterrupted: the same parameters, bit for bit;
    # and another seed (the one drawn plus one) trains another run
    given, other = th.run_mains([
        th.train_command(tmp_path / "given", *COMMON, f"--gin.RANDOM_SEED={seed}", steps=4)[3:],
        th.train_command(tmp_path / "other", *COMMON, f"--gin.RANDOM_SEED={seed + 1}",
                         steps=2)[3:]])
    assert given.returncode == 0, th.describe(given)
    th.assert_trees_equal(_params(run_dir, 4), _params(tmp_path / "given", 4), "parameters")
    assert th.scalars(run_dir)["loss"] == th.scalars(tmp_path / "given")["loss"]
    assert other.returncode == 0, th.describe(other)
    assert any(not np.array_equal(a, b) for a, b in zip(
        _params(run_dir, 2).values(), _params(tmp_path / "other", 2).values()))


def test_a_damaged_seed_file_is_one_line_and_nothing_is_drawn_over_it(drawn):
    run_dir, proc = drawn["damaged"]
    assert proc.returncode == 2, th.describe(proc)
    line = th.assert_one_error(proc, "random_seed.json", "does not hold this run's seed",
                               "RANDOM_SEED")
    assert str(run_dir) in line
    assert (run_dir / "random_seed.json").read_text() == "{\"random_seed\": -3}\n"


_TWO_PROCESSES = """
import sys
from pathlib import Path
from t5lite.runtime.process import distributed
from t5lite.runtime import run_seed
distributed.join(distributed.DistributedSettings(sys.argv[1], 2, int(sys.argv[2])))
print("SEED", run_seed.resolve(None, Path(sys.argv[3])), flush=True)
distributed.leave(0)
"""


def test_every_process_takes_process_0s_draw(tmp_path):
    port = th.free_port()
    procs = [th.start([sys.executable, "-c", _TWO_PROCESSES, f"127.0.0.1:{port}", str(i),
                       str(tmp_path / "run")], tmp_path / f"p{i}.log") for i in range(2)]
    try:
        rcs = [th.finish(p, timeout=120) for p in procs]
    finally:
        for p in procs:
            th.kill(p)
    logs = [th.read_log(tmp_path / f"p{i}.log") for i in range(2)]
    assert rcs == [0, 0], "\n".join(th.tail(t) for t in logs)
    seeds = [int(re.search(r"^SEED (\d+)$", t, re.M).group(1)) for t in logs]
    kept = json.loads((tmp_path / "run" / "random_seed.json").read_text())["random_seed"]
    assert seeds == [kept, kept]
