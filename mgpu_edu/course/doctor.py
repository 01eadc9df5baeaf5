"""``mgpu-edu doctor``: what this machine offers the lessons, what will work, and how to fix what won't.

Versions are read from installed package metadata, so everything but the TensorFlow line is
instant and works without TensorFlow. The TensorFlow line imports TensorFlow (a few seconds)
to ask which GPUs it can use; pass ``tensorflow=False`` to skip that.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as metadata
import re
import sys

from mgpu_edu import __version__
from mgpu_edu.course import manifest as course
from mgpu_edu.runtime import env as _env
from mgpu_edu.runtime import quiet

#: Distributions that provide ``import tensorflow``, in the order we report them.
TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-macos", "tensorflow-intel", "tf-nightly")
SUPPORTED_PYTHON = ((3, 11), (3, 13))  # pyproject.toml's requires-python (tests/test_packaging.py)
MIN_TENSORFLOW = (2, 16)


@dataclasses.dataclass(frozen=True)
class Finding:
    """One line of the report: what was found, whether it's fine, and the fix when it isn't.

    ok is True (fine), False (a lesson won't work until fixed) or None (worth knowing).
    """

    name: str
    value: str
    ok: bool | None = True
    fix: str = ""


def version_of(*distributions: str) -> tuple[str, str] | None:
    """(distribution, version) of the first of these distributions that is installed, or None.

    Example:
        >>> version_of("no-such-package-here") is None
        True
    """
    for name in distributions:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _release(version: str) -> tuple[int, int]:
    """(2, 21) for "2.21.0rc1": the major and minor numbers.

    Example:
        >>> _release("2.21.0rc1"), _release("8")
        ((2, 21), (8, 0))
    """
    match = re.match(r"(\d+)(?:\.(\d+))?", version)
    return (int(match.group(1)), int(match.group(2) or 0)) if match else (0, 0)


def pip_install(extra: str) -> str:
    """The command that installs mgpu_edu with extra from the course's repository at its ref, as the lessons'
    Colab cell does (the package is not on PyPI, where the name would install someone else's)."""
    try:
        shipped = course.shipped()
        repo, ref = shipped.repo, shipped.ref
    except (course.ManifestError, FileNotFoundError):
        repo, ref = "OWNER/NAME", "REF"
    return f'pip install "{course.requirement(repo, ref, extra)}"'


def _install_hint(environment: _env.Environment) -> str:
    if environment.platform == "colab":
        return "Colab ships TensorFlow: Runtime → Disconnect and delete runtime, then run the lesson again"
    extra = "gpu" if environment.has_gpu and sys.platform.startswith("linux") else "cpu"
    return f"{pip_install(extra)} (or, in a clone of the course, make lab)"


def _python_finding() -> Finding:
    low, high = SUPPORTED_PYTHON
    version = ".".join(map(str, sys.version_info[:3]))
    ok = low <= sys.version_info[:2] <= high
    return Finding("Python", version, ok, "" if ok else
                   f"the course supports and tests Python {low[0]}.{low[1]}–{high[0]}.{high[1]}: "
                   "create a virtual environment with one of those")


def _tensorflow_findings(environment: _env.Environment, import_tf: bool) -> list[Finding]:
    found = version_of(*TENSORFLOW_DISTRIBUTIONS)
    if found is None:
        return [Finding("TensorFlow", "not installed", False, _install_hint(environment))]
    dist, version = found
    if _release(version) < MIN_TENSORFLOW:
        return [Finding("TensorFlow", f"{version} ({dist})", False,
                        'the lessons need TensorFlow 2.16 or newer (Keras 3): pip install -U "tensorflow>=2.16"')]
    findings = [Finding("TensorFlow", f"{version} ({dist})")]
    if not import_tf:
        return findings
    try:
        tf = quiet.import_tensorflow()
        gpus = tf.config.list_physical_devices("GPU")
    except Exception as error:  # report whatever a broken install raises
        return [Finding("TensorFlow", f"{version} ({dist}) fails to import: {type(error).__name__}: {error}", False,
                        f"reinstall it in a fresh virtual environment: {_install_hint(environment)}")]
    built_with_cuda = bool(tf.test.is_built_with_cuda())
    seen = f"{len(gpus)} GPU(s) visible to TensorFlow" + ("" if built_with_cuda else ", a CPU-only build")
    if environment.has_gpu and not gpus:
        fix = ("Runtime → Change runtime type → T4 GPU, then Runtime → Restart session"
               if environment.platform == "colab" else
               f"install the CUDA build: {pip_install('gpu')} (Linux), then restart the kernel")
        findings.append(Finding("TensorFlow GPUs", seen + "; nvidia-smi lists "
                                f"{len(environment.gpus)}", None, fix))
    else:
        findings.append(Finding("TensorFlow GPUs", seen))
    return findings


def _package_findings(environment: _env.Environment) -> list[Finding]:
    findings = []
    keras = version_of("keras")
    if keras is None or _release(keras[1]) < (3, 0):
        findings.append(Finding("Keras", keras[1] if keras else "not installed", False,
                                'the lessons use Keras 3: pip install -U "keras>=3"'))
    else:
        findings.append(Finding("Keras", keras[1]))
    widgets = version_of("ipywidgets")
    lab = version_of("jupyterlab")
    if widgets is None or _release(widgets[1]) < (7, 7):
        findings.append(Finding("ipywidgets", widgets[1] if widgets else "not installed", False,
                                'the explorers need ipywidgets 7.7 or 8: pip install "ipywidgets>=7.7,<9" '
                                "(on Colab keep the 7.7.1 it ships)"))
    elif environment.platform == "colab" and _release(widgets[1]) < (8, 0):
        findings.append(Finding("ipywidgets", f"{widgets[1]} (Colab's own; keep it: upgrading forces a restart)"))
    elif _release(widgets[1]) < (8, 0) and lab is not None and _release(lab[1]) >= (4, 0):
        findings.append(Finding("ipywidgets", widgets[1], None,
                                f"JupyterLab {lab[1]} shows widgets only with ipywidgets 8: "
                                'pip install "ipywidgets>=8,<9" (Colab is different: keep its 7.7.1)'))
    else:
        findings.append(Finding("ipywidgets", widgets[1]))
    for label, dist, fix in (
        ("matplotlib", "matplotlib", 'every lesson draws with it: pip install "matplotlib>=3.8"'),
        ("numpy", "numpy", "pip install numpy"),
        ("TensorBoard", "tensorboard", "lesson 08's profiler view needs it: pip install tensorboard"),
    ):
        found = version_of(dist)
        findings.append(Finding(label, found[1] if found else "not installed", found is not None,
                                "" if found else fix))
    if lab is not None:
        findings.append(Finding("JupyterLab", lab[1], None if _release(lab[1]) < (4, 0) else True,
                                "" if _release(lab[1]) >= (4, 0) else 'pip install -U "jupyterlab>=4"'))
    return findings


def _gpu_finding(environment: _env.Environment) -> Finding:
    if not environment.gpus:
        fix = ("optional: Runtime → Change runtime type → T4 GPU gives you a real GPU"
               if environment.platform == "colab" else "")
        return Finding("GPUs (nvidia-smi)", "none", None if fix else True, fix)
    names = ", ".join(f"{g.name} ({g.memory_mb:,} MB)" if g.memory_mb else g.name for g in environment.gpus)
    return Finding("GPUs (nvidia-smi)", names)


def diagnose(tensorflow: bool = True) -> list[Finding]:
    """Every finding about this machine, in report order. tensorflow=False skips importing TensorFlow.

    Example:
        >>> [f.name for f in diagnose(tensorflow=False)][:3]
        ['Platform', 'Python', 'mgpu_edu']
    """
    environment = _env.detect_environment()
    findings = [Finding("Platform", environment.label), _python_finding(), Finding("mgpu_edu", __version__)]
    findings += _tensorflow_findings(environment, tensorflow)
    findings += _package_findings(environment)
    findings.append(_gpu_finding(environment))
    return findings


def _course_span() -> str:
    """The shipped lessons' numbers, e.g. "00–08", from the course manifest."""
    try:
        return course.shipped().span
    except (course.ManifestError, FileNotFoundError):
        return "(none found: reinstall mgpu_edu with its lessons)"


def outlook(findings: list[Finding]) -> list[str]:
    """What will and won't work, one line each, from the findings."""
    by_name = {f.name: f for f in findings}
    tf_ok = by_name["TensorFlow"].ok is not False and by_name["Python"].ok
    tf_gpus = by_name.get("TensorFlow GPUs")
    tf_sees_gpu = tf_gpus is not None and not tf_gpus.value.startswith("0 ")
    lessons = f"Lessons {_course_span()}"
    lines = []
    if not tf_ok:
        lines.append(f"✗ {lessons} need TensorFlow first (see the fixes below).")
    elif tf_sees_gpu:
        lines.append(f"✓ {lessons}: setup_devices() splits GPU 0 into logical GPUs with memory limits.")
        lines.append("✓ Real GPU kernels: timings in lesson 08 mean something on this machine.")
    else:
        lines.append(f"✓ {lessons}: setup_devices() splits the CPU into logical CPUs: the same code paths, "
                     "no real speed-up.")
    if tf_ok and not tf_sees_gpu:
        lines.append("✗ NcclAllReduce (lesson 03) needs real GPUs; the other all-reduce algorithms run here.")
    widgets = by_name.get("ipywidgets")
    if widgets is not None and widgets.ok is False:
        lines.append("✗ The interactive explorers need ipywidgets; the rest of each lesson still runs.")
    elif widgets is not None and widgets.ok is None:
        lines.append("△ Explorers may not render in this JupyterLab (see ipywidgets below); they work in Colab.")
    else:
        lines.append("✓ Interactive explorers (ipywidgets).")
    board = by_name.get("TensorBoard")
    if board is not None and not board.ok:
        lines.append("✗ Lesson 08's TensorBoard profile (the rest of lesson 08 runs).")
    return lines


def report(tensorflow: bool = True) -> tuple[str, bool]:
    """The doctor's printed report, and whether the lessons can run (no finding is a blocker)."""
    findings = diagnose(tensorflow)
    width = max(len(f.name) for f in findings)
    marks = {True: "✓", False: "✗", None: "△"}
    lines = ["mgpu-edu doctor: what this machine offers the lessons", ""]
    lines += [f"  {marks[f.ok]} {f.name:<{width}}  {f.value}" for f in findings]
    lines += ["", "What will work here:"] + [f"  {line}" for line in outlook(findings)]
    fixes = [f for f in findings if f.fix]
    if fixes:
        lines += ["", "Fixes:"] + [f"  {f.name}: {f.fix}" for f in fixes]
    blockers = [f for f in findings if f.ok is False]
    return "\n".join(lines), not blockers
