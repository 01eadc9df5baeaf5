"""mgpu-edu doctor: each finding, and the fixes it suggests, on machines this one isn't."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from mgpu_edu import doctor
from mgpu_edu.runtime.env import Environment, GpuInfo

T4 = (GpuInfo(0, "Tesla T4", 15360),)


def fake_tensorflow(gpus: int, cuda: bool = True) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        config=types.SimpleNamespace(list_physical_devices=lambda kind: [f"/physical_device:GPU:{i}"
                                                                         for i in range(gpus)]),
        test=types.SimpleNamespace(is_built_with_cuda=lambda: cuda))


@pytest.fixture
def installed(monkeypatch):
    """Pretend these distributions (name -> version) are the installed ones."""
    def install(**versions):
        names = {name.replace("_", "-"): v for name, v in versions.items()}
        monkeypatch.setattr(doctor, "version_of",
                            lambda *dists: next(((d, names[d]) for d in dists if d in names), None))
    return install


def test_release_numbers():
    assert doctor._release("2.21.0rc1") == (2, 21)
    assert doctor._release("8") == (8, 0)
    assert doctor._release("dev") == (0, 0)


def test_gpu_the_driver_sees_but_tensorflow_does_not(monkeypatch, installed):
    installed(tensorflow_cpu="2.21.0")
    monkeypatch.setattr("mgpu_edu.quiet.import_tensorflow", lambda: fake_tensorflow(0, cuda=False))
    local = doctor._tensorflow_findings(Environment("local", T4, "3.11.7"), import_tf=True)
    assert local[1].ok is None and "nvidia-smi lists 1" in local[1].value
    assert doctor.pip_install("gpu") in local[1].fix
    colab = doctor._tensorflow_findings(Environment("colab", T4, "3.13.0"), import_tf=True)
    assert "Runtime → Change runtime type" in colab[1].fix


def test_tensorflow_with_a_gpu_unlocks_logical_gpus(monkeypatch, installed):
    installed(tensorflow="2.20.0")
    monkeypatch.setattr("mgpu_edu.quiet.import_tensorflow", lambda: fake_tensorflow(1))
    findings = [doctor.Finding("Python", "3.13.0"), doctor.Finding("GPUs (nvidia-smi)", "Tesla T4")]
    findings += doctor._tensorflow_findings(Environment("colab", T4, "3.13.0"), import_tf=True)
    lines = doctor.outlook(findings)
    assert any("logical GPUs with memory limits" in line for line in lines)
    assert not any("NcclAllReduce" in line for line in lines)


@pytest.mark.parametrize(("versions", "value", "fix"), [
    ({}, "not installed", 'pip install "mgpu-edu[cpu] @ git+https://github.com/'),
    ({"tensorflow": "2.15.1"}, "2.15.1 (tensorflow)", "2.16 or newer"),
])
def test_missing_or_old_tensorflow_blocks_with_a_fix(installed, versions, value, fix):
    installed(**versions)
    [finding] = doctor._tensorflow_findings(Environment("local", (), "3.11.7"), import_tf=True)
    assert (finding.ok, finding.value) == (False, value) and fix in finding.fix


def test_every_install_doctor_advises_is_one_the_readme_gives():
    """The package is not on PyPI: doctor's commands install from the course's repository at its ref, the
    README's own commands (a name on PyPI would install whoever claimed it)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    for extra in ("cpu", "gpu"):
        command = doctor.pip_install(extra)
        assert "@ git+https://github.com/" in command and f"`{command}`" in readme, command


def test_tensorflow_that_fails_to_import(monkeypatch, installed):
    installed(tensorflow="2.21.0")

    def broken():
        raise ImportError("libcudart.so.12: cannot open shared object file")

    monkeypatch.setattr("mgpu_edu.quiet.import_tensorflow", broken)
    [finding] = doctor._tensorflow_findings(Environment("local", (), "3.11.7"), import_tf=True)
    assert finding.ok is False and "libcudart" in finding.value and "fresh virtual environment" in finding.fix


@pytest.mark.parametrize(("platform", "versions", "ok", "fix"), [
    ("local", {"ipywidgets": "7.7.1", "jupyterlab": "4.2.0"}, None, 'pip install "ipywidgets>=8,<9"'),
    ("colab", {"ipywidgets": "7.7.1", "jupyterlab": "4.2.0"}, True, ""),
    ("local", {"ipywidgets": "8.1.5", "jupyterlab": "4.2.0"}, True, ""),
    ("local", {"ipywidgets": "7.6.0"}, False, "ipywidgets>=7.7,<9"),
    ("local", {}, False, "ipywidgets>=7.7,<9"),
])
def test_ipywidgets_against_the_front_end(installed, platform, versions, ok, fix):
    installed(keras="3.13.2", **versions)
    findings = {f.name: f for f in doctor._package_findings(Environment(platform, (), "3.13.0"))}
    assert findings["ipywidgets"].ok is ok
    assert fix in findings["ipywidgets"].fix


def test_unsupported_python_and_keras_2(monkeypatch, installed):
    monkeypatch.setattr(doctor.sys, "version_info", (3, 14, 0))
    assert doctor._python_finding().ok is False and "3.11–3.13" in doctor._python_finding().fix
    monkeypatch.setattr(doctor.sys, "version_info", (3, 10, 13))  # past its end of life (October 2026)
    assert doctor._python_finding().ok is False and "3.11–3.13" in doctor._python_finding().fix
    installed(keras="2.15.0", ipywidgets="8.1.5")
    keras = doctor._package_findings(Environment("local", (), "3.11.7"))[0]
    assert (keras.name, keras.ok) == ("Keras", False) and "keras>=3" in keras.fix


def test_report_on_this_machine_without_importing_tensorflow():
    text, ready = doctor.report(tensorflow=False)
    assert text.startswith("mgpu-edu doctor") and "What will work here:" in text
    assert ready is all(f.ok is not False for f in doctor.diagnose(tensorflow=False))
