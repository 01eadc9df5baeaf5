"""The package as a user meets it: instant import, quiet TensorFlow, docs that run."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import mgpu_edu
from mgpu_edu import devices, processes, show_source


def test_import_does_not_load_tensorflow():
    out = processes.run_in_new_process(
        "import sys, time\n"
        "t = time.perf_counter()\n"
        "import mgpu_edu, mgpu_edu.check, mgpu_edu.course, mgpu_edu.source\n"
        "print(time.perf_counter() - t)\n"
        "print('tensorflow' in sys.modules, 'keras' in sys.modules)\n"
    )
    assert out.returncode == 0, out.stderr
    seconds, loaded = out.stdout.splitlines()
    assert loaded == "False False"
    print(f"import mgpu_edu took {float(seconds):.3f} s (budget 0.3 s; measured, not asserted)")


def test_tensorflow_import_is_silent():
    out = processes.run_in_new_process(
        "from mgpu_edu import import_tensorflow\n"
        "tf = import_tensorflow()\n"
        "tf.get_logger().info('hidden')\n"
        "print(float(tf.reduce_sum(tf.ones(3))))\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "3.0\n"
    assert "oneDNN" not in out.stderr and "cuda" not in out.stderr.lower(), out.stderr


def test_new_process_runs_the_code_as_its_main_program():
    """run_in_new_process adds one line of its own (the garbage collector frozen at exit); the code
    still runs as written: a __future__ import first, as __main__, tracebacks with its line numbers."""
    out = processes.run_in_new_process(
        "from __future__ import annotations\n"
        "import sys\n"
        "print(__name__)\n"
        "\n"
        "raise ValueError('on line 5')\n"
    )
    assert out.returncode == 1
    assert out.stdout == "__main__\n"
    assert 'line 5, in <module>' in out.stderr and out.stderr.strip().endswith("ValueError: on line 5")


MODULES = sorted(m.name for m in pkgutil.iter_modules(mgpu_edu.__path__, "mgpu_edu.") if m.name != "mgpu_edu.__main__")


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


@pytest.mark.parametrize("name", MODULES)
def test_public_functions_have_docstrings_and_hints(name):
    module = importlib.import_module(name)
    for attr, obj in vars(module).items():
        if attr.startswith("_") or getattr(obj, "__module__", None) != name or not callable(obj):
            continue
        assert obj.__doc__, f"{name}.{attr} has no docstring"
        if isinstance(obj, type):
            continue
        assert "return" in obj.__annotations__, f"{name}.{attr} has no return type hint"


def test_show_source_and_bad_object():
    source = show_source(devices.default_memory_limit_mb)
    assert repr(source).startswith("def default_memory_limit_mb(")
    assert "mgpu_edu.devices.default_memory_limit_mb" in source._repr_html_()
    with pytest.raises(TypeError, match="can't find source code"):
        show_source(42)
