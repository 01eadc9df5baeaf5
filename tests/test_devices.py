"""setup_devices and friends: bad inputs in-process, each real layout in its own process,
and the GPU branch against a fake ``tf.config`` (CI has no GPU)."""

from __future__ import annotations

import pytest

from conftest import run_fresh
from mgpu_edu import devices
from mgpu_edu.runtime.devices import DeviceSetupError, default_memory_limit_mb, setup_devices

# ---------------------------------------------------------------- bad inputs (no TF needed)


@pytest.mark.parametrize(
    ("n", "error", "shown"),
    [
        (0, ValueError, "n=0"),
        (-1, ValueError, "n=-1"),
        (65, ValueError, "n=65"),
        (2.5, TypeError, "n=2.5"),
        ("4", TypeError, "n='4'"),
        (True, TypeError, "n=True"),
        (None, TypeError, "n=None"),
    ],
)
def test_bad_n_names_value_and_range(n, error, shown):
    with pytest.raises(error) as caught:
        setup_devices(n)
    message = str(caught.value)
    assert shown in message
    assert "1 to 64" in message or "from 1" in message
    assert "setup_devices(4)" in message  # says what to do


@pytest.mark.parametrize(
    ("limit", "error", "shown"),
    [
        (0, ValueError, "memory_limit_mb=0"),
        (-5, ValueError, "memory_limit_mb=-5"),
        ("1k", TypeError, "memory_limit_mb='1k'"),
        (1.5, TypeError, "memory_limit_mb=1.5"),
        (True, TypeError, "memory_limit_mb=True"),
    ],
)
def test_bad_memory_limit_names_value_and_fix(limit, error, shown):
    with pytest.raises(error) as caught:
        setup_devices(2, memory_limit_mb=limit)
    assert shown in str(caught.value)
    assert "memory_limit_mb=1024" in str(caught.value)


def test_prefer_physical_must_be_bool():
    with pytest.raises(TypeError, match="prefer_physical must be True or False, got 'yes'"):
        setup_devices(2, prefer_physical="yes")


@pytest.mark.parametrize(
    ("total", "n", "expected"),
    [(15360, 4, 3072), (15360, 5, 2304), (16384, 2, 6400), (81920, 8, 8192), (1000, 8, 100)],
)
def test_default_memory_limit(total, n, expected):
    assert default_memory_limit_mb(total, n) == expected
    assert n * expected <= total * devices.USABLE_FRACTION


# ---------------------------------------------------------------- the GPU branch, faked


def test_t4_splits_into_four_with_default_limit(fake_gpu, capsys):
    config = fake_gpu(gpus=1, name="Tesla T4", memory_mb=15360)
    layout = setup_devices(4)
    assert capsys.readouterr().out.strip() == "Colab · 1 × Tesla T4 → 4 logical GPUs × 3,072 MB"
    assert [c.memory_limit for c in config.logical_config] == [3072] * 4
    assert layout.kind == "GPU" and layout.mode == "split"
    assert list(layout) == [f"/device:GPU:{i}" for i in range(4)]
    assert layout.memory_limits_mb == (3072,) * 4
    assert "3,072 MB" in repr(layout) and "mgpu-layout" in layout._repr_html_()
    assert devices.logical_devices(2) == ["/device:GPU:0", "/device:GPU:1"]


def test_explicit_limit_is_applied(fake_gpu, capsys):
    config = fake_gpu(gpus=1, name="Tesla T4", memory_mb=15360, platform="local")
    setup_devices(3, memory_limit_mb=2000)
    assert capsys.readouterr().out.strip() == "Local · 1 × Tesla T4 → 3 logical GPUs × 2,000 MB"
    assert [c.memory_limit for c in config.logical_config] == [2000] * 3


def test_total_over_gpu_memory_is_refused(fake_gpu):
    config = fake_gpu(gpus=1, name="Tesla T4", memory_mb=15360)
    with pytest.raises(ValueError) as caught:
        setup_devices(4, memory_limit_mb=5000)
    message = str(caught.value)
    assert "4 × 5,000 MB = 20,000 MB" in message and "15,360 MB" in message
    assert "at most 3,840 MB" in message
    assert config.calls == []  # nothing was configured


def test_unknown_gpu_memory_falls_back_and_says_so(fake_gpu, capsys):
    fake_gpu(gpus=1, name="Mystery GPU", memory_mb=None, platform="local")
    layout = setup_devices(2)
    assert layout.memory_limits_mb == (devices.FALLBACK_LIMIT_MB,) * 2
    assert "GPU memory unknown" in capsys.readouterr().out


def test_enough_physical_gpus_are_used_as_they_are(fake_gpu, capsys):
    config = fake_gpu(gpus=8, name="NVIDIA H100", memory_mb=81559, platform="local")
    layout = setup_devices(4)
    assert layout.mode == "physical" and len(layout) == 4
    assert config.calls == ["set_visible_devices(4)", "enable_tensor_float_32_execution(False)"]
    assert config.logical_config is None
    assert capsys.readouterr().out.strip() == "Local · 8 × NVIDIA H100 → 4 physical GPUs, used as they are"


def test_prefer_physical_false_splits_gpu0_and_hides_the_rest(fake_gpu, capsys):
    config = fake_gpu(gpus=2, name="NVIDIA A100", memory_mb=40960, platform="local")
    layout = setup_devices(2, prefer_physical=False)
    assert layout.mode == "split"
    assert config.calls == ["set_visible_devices(1)", "set_logical_device_configuration(/physical_device:GPU:0, 2)",
                            "enable_tensor_float_32_execution(False)"]
    assert "GPU 0 only" in capsys.readouterr().out


def test_gpu_already_initialised_gives_guided_error(fake_gpu):
    fake_gpu(gpus=1, initialized=True)
    with pytest.raises(DeviceSetupError) as caught:
        setup_devices(4)
    message = str(caught.value)
    assert "already has 1 logical GPU" in message and "4 logical GPUs × 3,072 MB" in message
    assert "Runtime → Restart session" in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_same_call_is_noop_and_different_layout_names_both(fake_gpu, capsys):
    config = fake_gpu(gpus=1)
    first = setup_devices(4)
    assert setup_devices(4) is first
    assert config.calls == ["set_logical_device_configuration(/physical_device:GPU:0, 4)",
                            "enable_tensor_float_32_execution(False)", "enable_tensor_float_32_execution(False)"]
    with pytest.raises(DeviceSetupError) as caught:
        setup_devices(2)
    message = str(caught.value)
    assert "4 logical GPUs × 3,072 MB (from setup_devices(4))" in message
    assert "2 logical GPUs × 6,144 MB" in message
    assert "Restart" in message


@pytest.mark.parametrize("name, memory_mb, share", [("NVIDIA H100 80GB HBM3", 81559, "16,128"),
                                                     ("NVIDIA A100-SXM4-40GB", 40960, "8,192")])  # 9.0 and 8.0
def test_tf32_off_by_default_and_said_where_the_gpu_has_it(fake_gpu, capsys, name, memory_mb, share):
    config = fake_gpu(gpus=1, name=name, memory_mb=memory_mb, platform="local")
    layout = setup_devices(4)
    assert config.tf32 is False and layout.tf32 is False
    assert capsys.readouterr().out.strip() == (
        f"Local · 1 × {name} → 4 logical GPUs × {share} MB "
        "(TF32 off, so split models can equal one device to float32 rounding; lesson 08.)")
    on = setup_devices(4, tf32=True)  # the same devices, TF32 back to TensorFlow's default
    assert config.tf32 is True and on.tf32 is True and list(on) == list(layout)
    assert "(TF32 on: float32 products round inputs to TF32.)" in capsys.readouterr().out
    assert setup_devices(4).tf32 is False and config.tf32 is False  # and off again
    config.tf32 = True  # switched on by hand in between: the same call again turns it off
    assert setup_devices(4).tf32 is False and config.tf32 is False


def test_tf32_note_on_physical_gpus_too(fake_gpu, capsys):
    config = fake_gpu(gpus=4, name="NVIDIA H100 80GB HBM3", memory_mb=81559, platform="local")
    layout = setup_devices(4)
    assert layout.mode == "physical" and config.tf32 is False
    assert capsys.readouterr().out.strip().endswith("4 physical GPUs, used as they are (TF32 off, so split models "
                                                    "can equal one device to float32 rounding; lesson 08.)")


def test_tf32_switch_is_set_but_not_mentioned_on_a_t4(fake_gpu, capsys):
    config = fake_gpu(gpus=1, name="Tesla T4", memory_mb=15360)
    layout = setup_devices(4)
    assert config.tf32 is False and layout.tf32 is None  # compute capability 7.5: no TF32 to turn off
    assert "TF32" not in capsys.readouterr().out


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_bad_tf32_names_value_and_meaning(fake_gpu, value):
    config = fake_gpu(gpus=1)
    with pytest.raises(TypeError, match=rf"tf32 must be True or False, got {value!r}.*setup_devices\(4, tf32=True\)"):
        setup_devices(4, tf32=value)
    assert config.calls == []


def test_logical_devices_bad_k(fake_gpu):
    fake_gpu(gpus=1)
    setup_devices(2, verbose=False)
    with pytest.raises(ValueError, match=r"k=3 must be a whole number from 1 to 2.*setup_devices\(3\)"):
        devices.logical_devices(3)
    with pytest.raises(TypeError, match="k='2'"):
        devices.logical_devices("2")
    assert devices.logical_devices() == ["/device:GPU:0", "/device:GPU:1"]


# ---------------------------------------------------------------- real TF, one process each


@pytest.mark.processes
def test_four_logical_cpus_with_banner():
    out = run_fresh("""
        from mgpu_edu import setup_devices, logical_devices
        import tensorflow as tf
        layout = setup_devices(4)
        again = setup_devices(4)
        with tf.device(layout[3]):
            x = tf.ones(2)
        result = {"names": list(layout), "same": again is layout, "placed": x.device,
                  "tf32": tf.config.experimental.tensor_float_32_execution_enabled(),
                  "logical": len(tf.config.list_logical_devices("CPU")), "two": logical_devices(2)}
    """)
    result = out["result"]
    assert result["names"] == [f"/device:CPU:{i}" for i in range(4)]
    assert result["logical"] == 4 and result["same"]
    assert result["tf32"] is False  # set on CPUs too, where it changes nothing, so every machine reads the same
    assert result["placed"].endswith("CPU:3")
    assert result["two"] == ["/device:CPU:0", "/device:CPU:1"]
    banner = out["stdout"].strip().splitlines()
    assert banner == ["Local · No GPU → 4 logical CPUs: same code paths, no real speed-up"] * 2


@pytest.mark.processes
def test_memory_limit_on_cpu_is_a_note_not_an_error():
    out = run_fresh("""
        from mgpu_edu import setup_devices
        layout = setup_devices(2, memory_limit_mb=512)
        result = {"limits": list(layout.memory_limits_mb)}
    """)
    assert out["result"]["limits"] == [None, None]
    assert "memory_limit_mb=512 not applied" in out["stdout"]
    assert "TensorFlow has no memory limits for logical CPUs" in out["stdout"]


@pytest.mark.processes
def test_real_late_reconfiguration_is_guided():
    out = run_fresh("""
        import tensorflow as tf
        tf.constant(1.0) + 1  # TensorFlow initialises its devices here
        from mgpu_edu import setup_devices, DeviceSetupError
        try:
            setup_devices(4)
            result = {"raised": None}
        except DeviceSetupError as error:
            result = {"raised": type(error).__name__, "message": str(error),
                      "cause": error.__cause__ is None and error.__suppress_context__}
        except RuntimeError as error:
            result = {"raised": "bare " + type(error).__name__, "message": str(error)}
    """)
    result = out["result"]
    assert result["raised"] == "DeviceSetupError", result
    assert result["cause"]
    assert "already has 1 logical CPU" in result["message"]
    assert "asks for 4 logical CPUs" in result["message"]
    assert "Runtime → Restart session" in result["message"]
    assert "Virtual devices cannot be modified" not in result["message"]


@pytest.mark.processes
def test_real_second_layout_is_refused_with_both_layouts():
    out = run_fresh("""
        from mgpu_edu import setup_devices, DeviceSetupError, logical_devices
        setup_devices(4, verbose=False)
        try:
            setup_devices(2)
            result = {"raised": None}
        except DeviceSetupError as error:
            result = {"raised": True, "message": str(error)}
        try:
            logical_devices(5)
        except ValueError as error:
            result["k"] = str(error)
    """)
    result = out["result"]
    assert result["raised"]
    assert "4 logical CPUs (from setup_devices(4))" in result["message"]
    assert "asks for 2 logical CPUs" in result["message"]
    assert "logical_devices(k=5)" in result["k"] and "from 1 to 4" in result["k"]
