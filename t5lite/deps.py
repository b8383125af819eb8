"""`python -m t5lite.deps`: check (and repair) which seqio / tensorflow-datasets the data
edge imports (wiring only; the check is `t5lite.data.package_check`).

    python -m t5lite.deps          # report; exit 1 on a mismatch
    python -m t5lite.deps --fix    # reinstall the released packages' files if needed

The t5 package depends on seqio-nightly and tfds-nightly, which install into the same
folders as the released seqio and tensorflow-datasets; whichever pip installs last wins.
"""
from __future__ import annotations

import argparse
import subprocess
import sys

from t5lite.config import flags
from t5lite.data.edge import package_check


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=flags.summary(__doc__))
    parser.add_argument("--fix", action="store_true",
                        help="reinstall the released packages' files over the nightlies'")
    args = parser.parse_args(argv)
    bad = package_check.problems()
    for module, dist, want in bad:
        print(f"{module}: imports {package_check.imported_version(module)!s}, not {dist}=={want} "
              f"(a nightly from the t5 package overwrote it)", file=sys.stderr)
    if bad and args.fix:
        pins = [f"{dist}=={want}" for _, dist, want in bad]
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                               "--force-reinstall", *pins])
        bad = package_check.problems()
    if bad:
        print("fix: python -m t5lite.deps --fix", file=sys.stderr)
        return 1
    for module, (dist, _) in package_check.PACKAGES.items():
        print(f"{module}: {package_check.imported_version(module)} ({dist})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
