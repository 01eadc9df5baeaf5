"""The ``mgpu-edu`` command: get the lessons, point them at a fork, make student versions, grade, diagnose.

Run ``mgpu-edu --help`` or ``mgpu-edu COMMAND --help``. Only ``doctor`` imports TensorFlow
(for its TensorFlow line); everything else starts instantly and works without it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mgpu_edu import __version__
from mgpu_edu.course import manifest as course
from mgpu_edu.course.assignments import (
    ExerciseResult,
    grade,
    without_exercises,
    write_nbgrader_course,
    write_student_versions,
)
from mgpu_edu.course.doctor import report
from mgpu_edu.course.manifest import MANIFEST, shipped_folder

EXAMPLES = """\
examples:
  mgpu-edu lessons my-lessons                      copy the lessons here, then: jupyter lab my-lessons
  mgpu-edu badges --repo my-school/mgpu_edu --ref fall-2027
  mgpu-edu student my-lessons handout              student versions: solutions stubbed, outputs cleared
  mgpu-edu nbgrader lessons course                 an nbgrader course: one assignment per lesson
  mgpu-edu grade handed-in/*.ipynb --csv grades.csv
  mgpu-edu doctor                                  what works on this machine, and fixes
"""


class CommandError(Exception):
    """A bad input or situation, reported as one line on stderr with exit status 2."""


def _require(command: str, *modules: str) -> None:
    """Raise CommandError naming the missing modules, and the extra that brings them, before any work."""
    import importlib.util

    def present(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ImportError:  # a broken installation counts as missing
            return False

    missing = [name for name in modules if not present(name)]
    if missing:
        raise CommandError(f"{command} needs {', '.join(missing)}, which this Python lacks. Install them with: "
                           "pip install \"mgpu-edu[instructor]\" (JupyterLab brings them too)")


def _lessons(args: argparse.Namespace) -> int:
    source = shipped_folder("lessons")
    target = Path(args.dir)
    if target.exists() and not target.is_dir():
        raise CommandError(f"{args.dir!r} exists and is not a folder. Give a folder to copy the lessons into.")
    notebooks = [*sorted(source.glob("*.ipynb")), source / MANIFEST]  # the lessons, and the list of them
    changed = [target / p.name for p in notebooks
               if (target / p.name).exists() and (target / p.name).read_bytes() != p.read_bytes()]
    if changed and not args.force:
        names = ", ".join(p.name for p in changed)
        raise CommandError(f"{len(changed)} lesson(s) in {args.dir!r} differ from the shipped ones ({names}); "
                           "they may hold your work. Pass --force to overwrite them, or choose another folder.")
    target.mkdir(parents=True, exist_ok=True)
    copied = 0
    for path in notebooks:
        destination = target / path.name
        if not destination.exists() or destination.read_bytes() != path.read_bytes():
            destination.write_bytes(path.read_bytes())
            copied += 1
    print(f"{copied} file(s) copied to {target} ({len(notebooks) - copied} already up to date).")
    print(f"Open them with: jupyter lab {target}")
    return 0


def _repository_folder(lessons: Path) -> tuple[str, Path | None]:
    """Where lessons sits in its git repository (for the badge links), and that repository's root."""
    resolved = lessons.resolve()
    for root in (resolved, *resolved.parents):
        if (root / ".git").exists():
            return resolved.relative_to(root).as_posix() or ".", root
    try:
        return resolved.relative_to(Path.cwd().resolve()).as_posix(), None
    except ValueError:
        return resolved.name, None


def _shown(path: Path) -> str:
    """path as the user would type it: relative to the current folder where it is inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _badges(args: argparse.Namespace) -> int:
    _require("badges", "nbformat")
    course.check_slug(args.repo)
    ref = course.check_ref(args.ref) if args.ref else None
    lessons = Path(args.lessons)
    known = course.load(lessons) if (lessons / course.MANIFEST).exists() else course.shipped()
    if not lessons.is_dir() or not any((lessons / lesson.file).exists() for lesson in known.lessons):
        raise CommandError(f"{args.lessons!r} holds none of the course's lessons ({known.lessons[0].file}, ...). "
                           "Run this in the root of your fork, or pass --lessons FOLDER.")
    ref = ref or known.ref
    folder, root = _repository_folder(lessons)
    readme = (root or Path.cwd()) / "README.md" if folder == "lessons" else None
    changed = course.configure(lessons, args.repo, ref, readme=readme, folder=course.check_folder(folder))
    manifest = lessons / course.MANIFEST
    if manifest.is_file() and course.set_defaults(manifest, args.repo, ref):
        changed.append(manifest)  # so the fork's tests and `make lessons` agree with its badges
    student = (root or Path.cwd()) / course.STUDENT
    if folder == "lessons" and manifest.is_file() and (student / course.MANIFEST).is_file():
        # the course's student versions are generated from lessons/: regenerate them, pointing at the fork too
        _require("badges", "nbformat", "nbconvert")
        from mgpu_edu.course.assignments import refresh_student_folder

        changed += refresh_student_folder(lessons, student)
    elif folder == course.STUDENT and root is not None and (root / "lessons" / course.MANIFEST).is_file():
        print(f"note: {course.STUDENT}/ is generated from lessons/: `mgpu-edu badges` without --lessons "
              "regenerates it, and points it at your fork too.", file=sys.stderr)
    for path in changed:
        print(f"updated {_shown(path)}")
    where = f"{args.repo}@{ref}"
    what = "lessons/, student/ and the README" if folder == "lessons" and readme is not None else f"{folder}/"
    print(f"{len(changed)} file(s) changed; the badges and Colab installs of {what} point at {where}."
          if changed else f"Nothing to change: {what} already point at {where}.")
    if changed and not args.ref:  # the ref came from the manifest: perhaps the original release's tag
        print(f"Tip: give your fork its own --ref (e.g. fall-2027). Without one the badges point at {ref}, "
              "and if that is the original release's tag, Colab opens the original lessons.")
    elif changed:
        print(_publish_hint(root, ref))
    return 0


def _publish_hint(root: Path | None, ref: str) -> str:
    """What to do after badges changed files: make ref exist on GitHub, the way that fits what ref is now."""
    import shutil
    import subprocess

    def exists(kind: str) -> bool:
        return subprocess.run(["git", "rev-parse", "-q", "--verify", f"refs/{kind}/{ref}"], cwd=root,
                              capture_output=True, check=False).returncode == 0

    if root is not None and shutil.which("git"):
        if exists("tags"):
            return (f"Next: commit. {ref!r} is already a tag, and a tag doesn't move: Colab and Binder would keep "
                    f"opening what it holds, without these changes. Run badges again with a new --ref (e.g. "
                    f"{ref}-2), commit, and tag that.")
        if exists("heads"):
            return f"Next: commit and push the branch (git push origin {ref}): Colab installs and opens it."
    return (f"Next: commit, then tag the commit and push it (git tag {ref} && git push origin HEAD {ref}): "
            "Colab installs and opens that tag.")


def _student(args: argparse.Namespace) -> int:
    _require("student", "nbformat", "nbconvert")

    written = write_student_versions(Path(args.src), Path(args.dst), force=args.force)
    for path in written:
        print(f"wrote {path}")
    _note_without_exercises(written)
    notebooks = sum(path.suffix == ".ipynb" for path in written)
    print(f"{notebooks} student version(s) in {args.dst}: solutions replaced by stubs, outputs cleared, "
          "checks kept.")
    return 0


def _note_without_exercises(written: list[Path]) -> None:
    """Say which of the notebooks written hold no exercise: nothing in them to hand in or to grade."""
    for path in without_exercises([p for p in written if p.suffix == ".ipynb"]):
        print(f"note: {path} has no exercises (no solution region, no check): it was copied as it is, and there "
              "is nothing in it to grade", file=sys.stderr)


def _nbgrader(args: argparse.Namespace) -> int:
    written = write_nbgrader_course(Path(args.src), Path(args.course), course_id=args.course_id, force=args.force)
    for path in written:
        print(f"wrote {path}")
    assignments = sorted(p for p in (Path(args.course) / "source").glob("*/*.ipynb"))
    _note_without_exercises([p for p in written if p.suffix == ".ipynb"])
    if not written:
        print(f"every file in {args.course} already up to date")
    first = assignments[0].parent.name if assignments else "ASSIGNMENT"
    try:  # the fork and release the lessons point at (lessons/course.toml), as their Colab cells install it
        manifest = course.load(Path(args.src))
        repo, ref = manifest.repo, manifest.ref
    except (OSError, ValueError):
        repo, ref = "OWNER/NAME", "REF"
    print(f"nbgrader course in {args.course}: {len(assignments)} assignment(s), one per lesson. Next, in an "
          f"environment with nbgrader (pip install \"{course.requirement(repo, ref, 'cpu,nbgrader')}\"): "
          f"cd {args.course} && nbgrader generate_assignment {first}")
    return 0


def _csv_target(text: str) -> Path:
    """The --csv file, checked before any grading: its folder must exist and take a new file."""
    import os

    target = Path(text)
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise CommandError(f"--csv {text}: that is a folder; give a file name, e.g. --csv {target / 'grades.csv'}")
    if not folder.is_dir():
        raise CommandError(f"--csv {text}: the folder {str(folder)!r} doesn't exist; create it first "
                           f"(mkdir -p {folder}) or write the gradebook elsewhere")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise CommandError(f"--csv {text}: this user can't write there; choose a folder you can write to")
    return target


def _grade(args: argparse.Namespace) -> int:
    _require("grade", "nbformat", *(() if args.no_execute else ("nbclient", "ipykernel")))
    csv_file = _csv_target(args.csv) if args.csv else None  # before grading, not after
    results, failed = [], []
    for notebook in args.notebooks:
        print(f"grading {notebook} ...", file=sys.stderr, flush=True)
        try:
            graded = grade(Path(notebook), execute=not args.no_execute, timeout=args.timeout)
        except Exception as error:  # a handed-in file can be anything: report it, grade the others
            reason = " ".join(f"{type(error).__name__}: {error}".split())[:300]
            print(f"  could not grade {notebook}: {reason}", file=sys.stderr, flush=True)
            failed.append(notebook)
            results.append(ExerciseResult(notebook, 0, "-", "failed", f"could not be graded: {reason}"))
            continue
        if not graded:
            failed.append(notebook)
            graded = [ExerciseResult(notebook, 0, "-", "failed", "no exercises: this notebook calls no "
                                     "mgpu_edu check, so there is nothing to grade (is it a course lesson?)")]
        results += graded
    width = max([len(r.notebook) for r in results] + [8])
    print(f"{'notebook':<{width}}  ex  {'check':<22}  {'status':<9}  feedback")
    for r in results:
        print(f"{r.notebook:<{width}}  {r.exercise or '-':>2}  {r.check:<22}  {r.status:<9}  {r.message}")
    for notebook in dict.fromkeys(r.notebook for r in results):
        mine = [r for r in results if r.notebook == notebook]
        if notebook in failed:
            print(f"{notebook}: not graded ({mine[0].message})")
        else:
            print(f"{notebook}: {sum(r.status == 'correct' for r in mine)}/{len(mine)} correct")
    if csv_file is not None:
        import csv

        with open(csv_file, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["notebook", "exercise", "check", "status", "feedback"])
            writer.writerows([r.notebook, r.exercise or "", r.check, r.status, r.message] for r in results)
        print(f"wrote {csv_file}")
    if failed:
        print(f"{len(failed)} of {len(args.notebooks)} notebook(s) could not be graded: {', '.join(failed)}",
              file=sys.stderr)
    return 1 if failed else 0


def _doctor(args: argparse.Namespace) -> int:
    text, ready = report(tensorflow=not args.no_tensorflow)
    print(text)
    return 0 if ready else 1


def _positive_seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds above 0; try 600")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for ``mgpu-edu`` and its subcommands."""
    parser = argparse.ArgumentParser(
        prog="mgpu-edu", description="Multi-GPU training lessons: copy them, point them at your fork, "
        "make student versions, grade them, and check this machine.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"mgpu-edu {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    lessons = commands.add_parser("lessons", help="copy the lessons shipped with this package into a folder",
                                  description="Copy the lesson notebooks shipped inside the installed package "
                                  "into DIR (created if needed). Lessons already there and unchanged are left "
                                  "alone; changed ones are never overwritten without --force.")
    lessons.add_argument("dir", metavar="DIR", help="folder to copy the lessons into")
    lessons.add_argument("--force", action="store_true", help="overwrite lessons in DIR that you have changed")
    lessons.set_defaults(run=_lessons)

    badges = commands.add_parser("badges", help="point the lessons' badges and Colab install at your fork",
                                 description="Rewrite every lesson's Open-in-Colab and Launch-Binder badges and "
                                 "its Colab install cell so they point at OWNER/NAME@REF. When DIR is the "
                                 "repository's lessons folder it also updates the README's links and install commands, "
                                 "and regenerates the student versions in the repository's student folder (what "
                                 "the README's buttons open) from the lessons; where DIR has a course.toml, its repo "
                                 "and ref too. Running it twice changes nothing.")
    badges.add_argument("--repo", required=True, metavar="OWNER/NAME",
                        help="your fork on GitHub, e.g. my-school/mgpu_edu")
    badges.add_argument("--ref", default=None,
                        help="tag, branch or commit Colab installs and badges open (default: the ref in the "
                        "lessons' course.toml)")
    badges.add_argument("--lessons", default="lessons", metavar="DIR", help="folder of lessons (default ./lessons)")
    badges.set_defaults(run=_badges)

    student = commands.add_parser("student", help="write student versions: solutions stubbed, outputs cleared",
                                  description="Write a student version of each notebook in SRC (a notebook or a "
                                  "folder) into the folder DST, as nbgrader's generate_assignment would. Each "
                                  "'### BEGIN SOLUTION' ... '### END SOLUTION' region becomes a stub that still "
                                  "runs, outputs and hidden tests are cleared, and the check calls stay, so an "
                                  "unsolved exercise reports 'not solved yet'.")
    student.add_argument("src", metavar="SRC", help="instructor notebook, or folder of them (e.g. lessons)")
    student.add_argument("dst", metavar="DST", help="folder for the student versions (e.g. handout; the "
                         "course's own student/ is kept up to date by badges)")
    student.add_argument("--force", action="store_true", help="overwrite student versions already in DST")
    student.set_defaults(run=_student)

    nbgrader = commands.add_parser("nbgrader", help="set up an nbgrader course folder from the lessons",
                                   description="Copy each notebook in SRC (a notebook or a folder) into "
                                   "COURSE/source/<lesson>/, one nbgrader assignment per lesson, and write "
                                   "COURSE/nbgrader_config.py, which makes nbgrader's generate_assignment stub "
                                   "solutions as `mgpu-edu student` does and gives cells 10 minutes to run.")
    nbgrader.add_argument("src", metavar="SRC", help="instructor notebook, or folder of them (e.g. lessons)")
    nbgrader.add_argument("course", metavar="COURSE", help="the nbgrader course folder (e.g. course)")
    nbgrader.add_argument("--course-id", default="mgpu_edu", help="nbgrader course id (default mgpu_edu)")
    nbgrader.add_argument("--force", action="store_true", help="overwrite files in COURSE that differ")
    nbgrader.set_defaults(run=_nbgrader)

    grade = commands.add_parser("grade", help="run handed-in notebooks and report each exercise's check",
                                description="Run each notebook in a fresh kernel (errors in it don't stop it) "
                                "and report what every exercise check said: correct, wrong, unsolved, or error. "
                                "A notebook that can't be read or run, or has no exercises, is reported as "
                                "'failed' with the reason, and the others are graded all the same; the CSV is "
                                "always written (its folder is checked first). Exit status 1 if any notebook "
                                "failed.")
    grade.add_argument("notebooks", nargs="+", metavar="NOTEBOOK", help="handed-in notebooks")
    grade.add_argument("--no-execute", action="store_true", help="read the outputs saved in the notebooks instead")
    grade.add_argument("--csv", metavar="FILE", help="also write the results to a CSV gradebook")
    grade.add_argument("--timeout", type=_positive_seconds, default=600, help="seconds per cell (default 600)")
    grade.set_defaults(run=_grade)

    doctor = commands.add_parser("doctor", help="what this machine offers, what will work, and fixes",
                                 description="Print Python, TensorFlow, Keras and ipywidgets versions, the GPUs, "
                                 "the platform (Colab, Binder or local), what will and won't work, and fixes. "
                                 "Exit status 1 when something the lessons need is missing.")
    doctor.add_argument("--no-tensorflow", action="store_true", help="don't import TensorFlow (faster)")
    doctor.set_defaults(run=_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``mgpu-edu`` with argv (default: the command line); return the exit status.

    Bad inputs print one line on stderr, saying what to do, and return 2.

    Example:
        >>> main(["student", "no-such-folder", "student"])
        2
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (CommandError, ValueError, FileNotFoundError, FileExistsError) as error:
        print(f"mgpu-edu {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
