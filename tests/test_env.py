"""Environment detection: nvidia-smi parsing and the platform override."""

from __future__ import annotations

import pytest

from mgpu_edu import env


def test_parse_nvidia_smi_several_gpus_and_junk():
    text = "0, Tesla T4, 15360\n1, NVIDIA A100-SXM4-40GB, 40960\nNVIDIA-SMI has failed\n2, Odd, [N/A]\n"
    gpus = env.parse_nvidia_smi(text)
    assert [g.name for g in gpus] == ["Tesla T4", "NVIDIA A100-SXM4-40GB", "Odd"]
    assert [g.memory_mb for g in gpus] == [15360, 40960, None]
    assert env.parse_nvidia_smi("") == ()


@pytest.mark.parametrize(("value", "label"), [("colab", "Colab"), ("BINDER", "Binder"), (" local ", "Local")])
def test_platform_override(monkeypatch, value, label):
    monkeypatch.setenv(env.PLATFORM_VARIABLE, value)
    env.detect_environment.cache_clear()
    try:
        assert env.detect_environment().label == label
    finally:
        env.detect_environment.cache_clear()


def test_bad_platform_override_is_explained(monkeypatch):
    monkeypatch.setenv(env.PLATFORM_VARIABLE, "kaggle")
    env.detect_environment.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"MGPU_EDU_PLATFORM='kaggle'.*colab, binder, local"):
            env.detect_environment()
    finally:
        env.detect_environment.cache_clear()


def test_detection_without_override(monkeypatch):
    monkeypatch.delenv(env.PLATFORM_VARIABLE, raising=False)
    for name in (*env._BINDER_VARIABLES, "COLAB_RELEASE_TAG"):
        monkeypatch.delenv(name, raising=False)
    env.detect_environment.cache_clear()
    try:
        assert env.detect_environment().platform == "local"
        monkeypatch.setenv("BINDER_REPO_URL", "https://github.com/x/y")
        env.detect_environment.cache_clear()
        assert env.detect_environment().platform == "binder"
    finally:
        env.detect_environment.cache_clear()


def test_no_nvidia_smi_means_no_gpus(monkeypatch):
    monkeypatch.setattr(env.shutil, "which", lambda name: None)
    assert env._query_nvidia_smi() == ()
