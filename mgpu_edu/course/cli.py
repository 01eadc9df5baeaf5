"""The ``mgpu-edu`` command: get the lessons, point them at a fork, make student versions, grade, diagnose.

Run ``mgpu-edu --help`` or ``mgpu-edu COMMAND --help``. Only ``doctor`` imports TensorFlow
(for its TensorFlow line); everything else starts instantly and works without it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mgpu_edu import __version__
from mgpu_edu.course import manifest as course
from mgpu_edu.course.assignments import (
    without_exercises,
    write_nbgrader_course,
    write_student_versions,
)
from mgpu_edu.course.doctor import report
from mgpu_edu.course.manifest import MANIFEST, shipped_folder

if TYPE_CHECKING:
    from mgpu_edu.course.grading import Graded

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
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CommandError(f"{args.dir!r}: can't make that folder ({error.strerror}). Give a folder you can "
                           "write to, for example: mgpu-edu lessons my-lessons") from None
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
    if folder == "lessons" and manifest.is_file() and any(student.glob("*.ipynb")):
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


def _feedback_target(text: str) -> Path:
    """The --feedback folder, made before any grading."""
    target = Path(text)
    if target.exists() and not target.is_dir():
        raise CommandError(f"--feedback {text}: that is a file; give a folder for the feedback files, e.g. "
                           "--feedback feedback")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CommandError(f"--feedback {text}: can't make that folder ({error.strerror}); choose another") from None
    return target


_COLUMNS = ["student", "notebook", "lesson", "exercise", "check", "status", "points", "max_points", "feedback"]


def _text(value: object) -> object:
    """A CSV field a spreadsheet won't run: text from a notebook (a file name, an error message) may start with
    "=", which Excel and LibreOffice read as a formula; a leading apostrophe keeps it text (OWASP's advice)."""
    formula = isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r") and value != "-"
    return f"'{value}" if formula else value


def _rows(g: Graded) -> list[list[object]]:
    """A notebook's CSV rows: one per exercise, then its total (status: graded, or why not; feedback: notes)."""
    return [[_text(value) for value in row] for row in _raw_rows(g)]


def _raw_rows(g: Graded) -> list[list[object]]:
    rows: list[list[object]] = []
    for r in g.results:
        if r.exercise:
            rows.append([g.name, str(g.path), g.lesson, r.exercise, r.check, r.status, f"{r.points:g}",
                         f"{r.max_points:g}", r.message])
    status = g.results[0].status if g.failed else "graded"
    notes = [g.results[0].message] if g.failed else []
    rows.append([g.name, str(g.path), g.lesson, "total", "", status, f"{g.points:g}",
                 f"{g.max_points:g}", "; ".join(notes + list(g.notes))])
    return rows


def _feedback_text(g: Graded) -> str:
    """What a student reads: the grade, each check's verdict and feedback, and what the grader noted."""
    if g.failed:
        return f"# {g.name}\n\nNot graded: {g.results[0].message}\n"
    lines = [f"# {g.name}: lesson {g.lesson}, {g.points:g} of {g.max_points:g} points", ""]
    for r in g.results:
        lines.append(f"- Exercise {r.exercise} ({r.check}): {r.status}. {r.message}")
    if g.notes:
        lines += ["", "Notes:"] + [f"- {note}" for note in g.notes]
    return "\n".join(lines) + "\n"


def _notebook_paths(given: list[str]) -> list[Path]:
    """The notebooks to grade: each file given, and every notebook under each folder given (checkpoints left out)."""
    paths = []
    for text in given:
        path = Path(text)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.ipynb") if not any(part.startswith(".") for part in
                                                                      p.relative_to(path).parts))
            if not found:
                raise CommandError(f"{text!r} is a folder with no notebooks (.ipynb) in it: give the folder the "
                                   "handed-in notebooks are in, or the notebooks themselves")
            paths += found
        else:
            paths.append(path)
    return paths


def _grade(args: argparse.Namespace) -> int:
    import csv
    import os
    import signal

    _require("grade", "nbformat", *(() if args.no_execute else ("nbclient", "ipykernel", "psutil")))
    from mgpu_edu.course import grading

    csv_file = _csv_target(args.csv) if args.csv else None  # before grading, not after
    feedback = _feedback_target(args.feedback) if args.feedback else None
    try:
        lessons = grading.course_lessons(Path(args.course) if args.course else None)
    except (OSError, ValueError) as error:
        raise CommandError(f"--course {args.course}: {error}") from None
    expected = None
    if args.lesson:
        matches = [f for f in lessons if args.lesson in (f, Path(f).stem) or Path(f).stem.startswith(args.lesson)]
        if len(matches) != 1:
            raise CommandError(f"--lesson {args.lesson}: {'no' if not matches else 'more than one'} lesson with "
                               f"exercises matches; give one of {', '.join(Path(f).stem for f in lessons)}")
        expected = matches[0]
    paths = _notebook_paths(args.notebooks)
    done: list[Graded] = []
    handle = open(csv_file, "w", newline="", encoding="utf-8") if csv_file else None  # noqa: SIM115
    writer = csv.writer(handle) if handle else None
    if writer:
        writer.writerow(_COLUMNS)
        handle.flush()
    bar = _progress(len(paths), args.no_execute)

    interrupted: list[int] = []  # the signal that stopped the batch, if one did

    def graded(result: Graded) -> None:
        if interrupted:  # a notebook whose kernel the interrupt ended: not graded
            return
        done.append(result)
        if writer:
            writer.writerows(_rows(result))
            handle.flush()
        if feedback is not None:
            target = feedback / f"{result.name}.md"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(_feedback_text(result), encoding="utf-8")
        bar(result)

    def stop(signum: int, frame: object) -> None:
        interrupted.append(signum)
        if not args.no_execute:  # every kernel ends now, so that nothing waits on a busy one while asyncio unwinds
            from mgpu_edu.course import sandbox

            sandbox.kill_tree(os.getpid(), spare_root=True)
        raise KeyboardInterrupt  # where Python swallows it (in a finalizer), `interrupted` still says so

    # Ctrl-C stops the batch even where the grader was started with SIGINT ignored (a process inherits that,
    # and Python then never raises KeyboardInterrupt): asyncio then unwinds every task, the kernels already gone.
    previous = signal.signal(signal.SIGTERM, stop) if hasattr(signal, "SIGTERM") else None
    previous_interrupt = signal.signal(signal.SIGINT, stop)
    try:
        if args.no_execute:
            print(f"note: --no-execute {grading.TRUSTED}", file=sys.stderr)
            for path, name in zip(paths, grading.names_for(paths), strict=True):
                graded(grading.grade_stored(path, name, lessons))
        else:
            from mgpu_edu.course import sandbox

            print(f"each notebook runs apart. {sandbox.describe()}", file=sys.stderr, flush=True)
            clone = Path(sandbox.package_folder())
            inside = [p for p in [*paths, *[Path(x) for x in (args.csv, args.feedback) if x]]
                      if (clone / "pyproject.toml").is_file() and clone in Path(os.path.abspath(p)).parents]
            if inside:
                print(f"note: {inside[0]} is inside {clone}, the clone mgpu_edu is installed from, which every "
                      "graded notebook can read: keep handed-in notebooks and grade files outside it",
                      file=sys.stderr)
            limits = grading.Limits(args.timeout, args.notebook_timeout, args.memory_mb)
            grading.grade_batch(paths, lessons, limits, jobs=args.jobs, expected=expected, on_graded=graded,
                                stopped=lambda: bool(interrupted))
        if interrupted:
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        if handle:
            handle.close()
        kept = f"; {csv_file} holds them" if csv_file else ""
        print(f"\ninterrupted: {len(done)} of {len(paths)} notebook(s) graded{kept}. Every kernel was stopped.",
              file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, previous_interrupt)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    order = {str(p): i for i, p in enumerate(paths)}
    results = sorted(done, key=lambda g: order.get(str(g.path), 0))
    if handle:  # rewritten in the order given, now that every row is in
        handle.close()
        with open(f"{csv_file}.part", "w", newline="", encoding="utf-8") as part:
            rows = csv.writer(part)
            rows.writerow(_COLUMNS)
            for result in results:
                rows.writerows(_rows(result))
        os.replace(f"{csv_file}.part", csv_file)
    _print_table(results)
    if csv_file:
        print(f"wrote {csv_file}")
    if feedback is not None:
        print(f"wrote {len(results)} feedback file(s) in {feedback}")
    failed = [str(g.path) for g in results if g.failed]
    if failed:
        print(f"{len(failed)} of {len(paths)} notebook(s) could not be graded: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _progress(total: int, quiet: bool) -> Callable[[Graded], None]:
    """A progress bar on stderr (tqdm's, where it is installed and stderr is a terminal), else a line per notebook."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None and sys.stderr.isatty() and not quiet:
        bar = tqdm(total=total, unit="notebook", file=sys.stderr, desc="grading")

        def advance(result: Graded) -> None:
            bar.set_postfix_str(str(result.name)[-30:])
            bar.update()
            if bar.n == total:
                bar.close()
        return advance
    count = [0]

    def line(result: Graded) -> None:
        count[0] += 1
        seconds = f" in {result.seconds:.0f} s" if result.seconds else ""
        print(f"graded {count[0]} of {total}: {result.name}{seconds}", file=sys.stderr, flush=True)
    return line


def _print_table(results: list[Graded]) -> None:
    width = max([len(g.name) for g in results] + [8])
    print(f"{'notebook':<{width}}  ex  {'check':<22}  {'status':<13}  feedback")
    for g in results:
        for r in g.results:
            print(f"{g.name:<{width}}  {r.exercise or '-':>2}  {r.check:<22}  {r.status:<13}  {r.message}")
    for g in results:
        if g.failed:
            print(f"{g.name}: not graded ({g.results[0].status}: {g.results[0].message})")
            continue
        correct = sum(r.status == "correct" for r in g.results)
        print(f"{g.name}: {correct}/{len(g.results)} correct, {g.points:g}/{g.max_points:g} points "
              f"(lesson {g.lesson})")
        for note in g.notes:
            print(f"  note: {note}")


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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number above 0; try 2")
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

    grade = commands.add_parser("grade", help="grade handed-in notebooks, each run apart, by the course's checks",
                                description="Grade each handed-in notebook by the course's own checks: its check "
                                "cells are put back from the course, it runs in a throwaway folder and a kernel "
                                "of its own with time and memory limits, and each exercise's answer is read from "
                                "the kernel as data and judged by the grader, not by what the notebook printed. "
                                "Every file gets a row, with a reason when it can't be graded. Exit status 1 if "
                                "any file couldn't be graded. docs/instructors.md explains what this prevents and "
                                "what it doesn't.")
    grade.add_argument("notebooks", nargs="+", metavar="NOTEBOOK", help="handed-in notebooks, or folders of them")
    grade.add_argument("--lesson", metavar="LESSON", help="the lesson assigned (e.g. 03_allreduce, or 03): a "
                       "notebook of another lesson is graded 'wrong lesson'")
    grade.add_argument("--course", metavar="DIR", help="the course's lessons folder, with its course.toml (default: "
                       "the lessons shipped with this mgpu_edu)")
    grade.add_argument("--csv", metavar="FILE", help="write a gradebook: a row per exercise and a total per notebook, "
                       "each row as its notebook finishes")
    grade.add_argument("--feedback", metavar="DIR", help="write a feedback file per notebook (Markdown) into DIR")
    grade.add_argument("--jobs", type=_positive_int, default=1, help="notebooks graded at once (default 1; at most "
                       "the number of cores, each with --memory-mb to spare)")
    grade.add_argument("--timeout", type=_positive_seconds, default=300, help="seconds a cell may run (default 300)")
    grade.add_argument("--notebook-timeout", type=_positive_seconds, default=1200,
                       help="seconds a whole notebook may run (default 1200)")
    grade.add_argument("--memory-mb", type=_positive_int, default=3000,
                       help="memory a notebook's kernel and its processes may hold together (default 3000)")
    grade.add_argument("--no-execute", action="store_true", help="don't run anything: read the feedback saved in "
                       "the notebooks, trusting it (a student can edit saved outputs)")
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
    except OSError as error:  # a folder that can't be made or written: one line, not a traceback
        where = f" {error.filename!r}" if error.filename else ""
        print(f"mgpu-edu {args.command}: error:{where} {error.strerror or error}; check the path, and that you "
              "may write there", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
