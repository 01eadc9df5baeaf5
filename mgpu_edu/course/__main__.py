"""``python -m mgpu_edu.course [ROOT]``: point the lessons, the README and student/ at the manifest."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from mgpu_edu.course.assignments import refresh_student_folder
from mgpu_edu.course.manifest import MANIFEST, STUDENT, configure


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mgpu_edu.course [ROOT]``: point the lessons, the README and student/ at the manifest."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m mgpu_edu.course",
        description="In the course repository ROOT (default: here), point every lesson's badges and Colab cell "
        "and the README's links at lessons/course.toml's repo and ref, strip run metadata, and regenerate the "
        "student versions in student/. Runs no lesson (make lessons executes them first). Only files that "
        "change are written.")
    parser.add_argument("root", nargs="?", default=".", metavar="ROOT", help="the repository's root (default: .)")
    root = Path(parser.parse_args(argv).root)
    if not (root / "lessons" / MANIFEST).is_file():
        parser.error(f"{str(root)!r} has no lessons/{MANIFEST}: run this in the course repository's root, "
                     "or give it: python -m mgpu_edu.course path/to/repository")
    changed = configure(root / "lessons", readme=root / "README.md")
    changed += refresh_student_folder(root / "lessons", root / STUDENT)
    for path in changed:
        print(f"updated {path}")
    print(f"{len(changed)} file(s) updated" if changed else "everything already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
