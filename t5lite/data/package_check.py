"""Which seqio / tensorflow-datasets the data edge imports (`python -m t5lite.deps` reports
and repairs it).

The t5 package depends on seqio-nightly and tfds-nightly, which install into the same
`seqio/` and `tensorflow_datasets/` folders as the released seqio and tensorflow-datasets
that t5lite asks for. Whichever pip installs last wins the files. This module compares
the version in the files that import with the released distribution's version, without
importing TensorFlow.
"""
from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import pathlib
import re
from typing import Dict, List, Optional, Tuple

# import name -> (released distribution, nightly distribution that shadows it)
PACKAGES: Dict[str, Tuple[str, str]] = {
    "seqio": ("seqio", "seqio-nightly"),
    "tensorflow_datasets": ("tensorflow-datasets", "tfds-nightly"),
}


def imported_version(module: str, search_path: Optional[List[str]] = None) -> Optional[str]:
    """Version written in `<module>/version.py` of the copy that `import module` finds."""
    if search_path is None:
        spec = importlib.util.find_spec(module)
        folders = list(spec.submodule_search_locations or []) if spec else []
    else:
        folders = [str(pathlib.Path(p) / module) for p in search_path]
    for folder in folders:
        path = pathlib.Path(folder) / "version.py"
        if not path.exists():
            continue
        text = path.read_text()
        parts = [re.search(rf"_{p}_VERSION\s*=\s*['\"]([^'\"]+)['\"]", text)
                 for p in ("MAJOR", "MINOR", "PATCH")]
        if all(parts):  # tensorflow_datasets: joined from three parts
            return ".".join(p.group(1) for p in parts)
        m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]\s*$", text, re.M)
        if m:
            return m.group(1)
    return None


def dist_version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def problems(search_path: Optional[List[str]] = None) -> List[Tuple[str, str, str]]:
    """[(import name, released dist, wanted version)] for each package whose importing
    files are not the released distribution's."""
    out = []
    for module, (dist, _nightly) in PACKAGES.items():
        want = dist_version(dist)
        if want is None:
            continue  # not installed (the GPU image has no data edge): nothing to check
        have = imported_version(module, search_path)
        if have != want:
            out.append((module, dist, want))
    return out
