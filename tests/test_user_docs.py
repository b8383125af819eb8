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


def _headings(doc: Path):
    """Its Markdown headings, and its paragraphs' bold run-in labels (`**Label.** ...`)."""
    text = doc.read_text()
    return ({re.sub(r"^#+\s*", "", l).strip() for l in text.splitlines() if l.startswith("#")}
            | {m.group(1).rstrip(".") for m in re.finditer(r"^\*\*([^*]+)\*\*", text, re.M)})


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_every_section_a_document_points_to_exists():
    """`docs/x.md, "Section"` (as the documents and docstrings cite one another) and
    Markdown links to `x.md#anchor`: the section is a heading of that file."""
    texts = _texts() + [(p.relative_to(REPO), p.read_text())
                        for p in sorted((REPO / "t5lite").glob("**/*.py"))]
    cited = re.compile(r"((?:docs/)?[\w/-]+\.md)`?,?\s+\"([^\"]+)\"")
    linked = re.compile(r"\]\(((?:[\w./-]+)?\.md)?#([\w-]+)\)")
    wrong = []
    for path, text in texts:
        for m in cited.finditer(text):
            name, section = m.group(1), " ".join(m.group(2).split())
            doc = REPO / name  # "docs/x.md", or "x.md" as docs/ cite one another
            if not doc.exists() and (REPO / "docs" / name).exists():
                doc = REPO / "docs" / name
            if not doc.exists():
                wrong.append(f"{path}: {name} (no such file)")
            elif section.rstrip(".") not in _headings(doc) and not any(
                    h.startswith(section.rstrip(".")) for h in _headings(doc)):
                wrong.append(f"{path}: {name}, \"{section}\"")
        for m in linked.finditer(text):
            target = m.group(1)
            doc = (REPO / path).parent / target if target else REPO / path
            if doc.exists() and m.group(2) not in {_anchor(h) for h in _headings(doc)}:
                wrong.append(f"{path}: {target or ''}#{m.group(2)}")
    assert not wrong, "\n".join(wrong)
