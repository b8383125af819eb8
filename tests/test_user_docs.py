"""The user's documents (README.md, docs/, scripts_gpu/README.md, the shipped gin files)
are true to the tree: every `configs/...` and `scripts_gpu/...` path they name exists,
every `python -m t5lite.X` they show is a module, and they speak of the product, not of
how it was built (no issue numbers, no work sessions)."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", REPO / "scripts_gpu" / "README.md",
               *(REPO / "docs").glob("**/*.md"), *(REPO / "configs").glob("**/*.gin")])


def _texts():
    return [(p.relative_to(REPO), p.read_text()) for p in DOCS]


def test_no_issue_numbers_or_work_sessions():
    pattern = re.compile(r"\bissue \d+|\b(?:first|second|third|fourth|fifth|sixth|seventh|"
                         r"eighth|ninth|tenth|eleventh|\d+th) session\b", re.IGNORECASE)
    found = [f"{path}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}"
             for path, text in _texts() for m in pattern.finditer(text)]
    assert not found, found


def test_every_named_path_exists():
    # configs/x.gin, scripts_gpu/x.sh ...: paths of this repository as a user types them
    pattern = re.compile(r"(?<![\w/.-])((?:configs|scripts_gpu|docs)/[\w./-]*\w)")
    missing = []
    for path, text in _texts():
        for m in pattern.finditer(text):
            name = m.group(1)
            if text[m.end():m.end() + 1] in ("*", "{", "<"):  # a pattern, not a path
                continue
            if not (REPO / name).exists():
                missing.append(f"{path}:{text[:m.start()].count(chr(10)) + 1}: {name}")
    assert not missing, missing


def test_every_module_a_command_runs_exists():
    missing = []
    for path, text in _texts():
        for m in re.finditer(r"python -m (t5lite(?:\.\w+)+)", text):
            parts = m.group(1).split(".")
            base = REPO.joinpath(*parts)
            if not (base.with_suffix(".py").exists() or (base / "__main__.py").exists()):
                missing.append(f"{path}: {m.group(1)}")
    assert not missing, missing


def test_the_readme_leads_to_every_path_within_its_first_60_lines():
    """A new user finds the command for each path (a laptop, T5 on GPUs, LoRA on LLaMA,
    a mixture of experts, a cluster, T5X, a GPU compiled for here) near the top, with a
    document to read next that exists."""
    head = (REPO / "README.md").read_text().splitlines()[:60]
    rows = [l for l in head if l.startswith("| ") and not l.startswith(("| ---", "| you"))]
    assert len(rows) >= 7, rows
    for row in rows:
        what, command, doc = [cell.strip() for cell in row.strip().strip("|").split("|")]
        assert what and (command.startswith("`") or "demo" in command), row
        assert (REPO / doc.strip("`")).exists(), row
    text = "\n".join(head)
    for needle in ("pip install -e . && python -m t5lite.deps --fix && python -m t5lite.train",
                   'pip install -e ".[test]"', "loss_per_token", 'pip install -e ".[gpu]"'):
        assert needle in text, needle
