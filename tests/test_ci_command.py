"""CI runs the README's test command, and that command runs every test: no marker or
keyword filter may leave tests out of CI (a test CI skips guards nothing)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    lines = [l for l in (REPO / "README.md").read_text().splitlines()
             if l.startswith('pip install -e ".[test]"')]
    assert len(lines) == 1, lines
    return lines[0]


def test_ci_runs_the_readme_test_command_and_it_selects_every_test():
    readme = _readme_test_command()
    pytest_part = re.search(r"python -m pytest[^&|;]*", readme).group(0).strip()
    words = pytest_part.split()
    assert words[:3] == ["python", "-m", "pytest"] and words[-1] == "tests", words
    assert not {"-m", "-k", "--deselect", "--ignore", "--lf", "-x"} & set(words[3:]), words
    ci = (REPO / ".ci" / "run").read_text()
    steps = [part.strip() for part in readme.split("&&")]
    for step in steps[:-1]:  # the install steps, then the same pytest command
        assert re.search(rf"^{re.escape(step)}$", ci, re.M), step
    assert re.search(rf"^{re.escape(pytest_part)} \|\| status=\$\?$", ci, re.M), ci
    ini = (REPO / "pytest.ini").read_text()
    # nothing deselected behind the command's back: the ini adds only the crash setting
    # and the order the files go to the workers in
    addopts = re.findall(r"^addopts\s*=(.*)$", ini, re.M)
    assert len(addopts) <= 1 and set(" ".join(addopts).split()) <= {
        "--max-worker-restart=0", "--no-loadscope-reorder"}, addopts
