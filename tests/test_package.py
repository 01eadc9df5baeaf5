"""The package as a user meets it: instant import, quiet TensorFlow, docs that run."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import mgpu_edu
from mgpu_edu import devices, processes, show_source


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_import_does_not_load_tensorflow():
    out = processes.run_in_new_process(
        "import sys, time\n"
        "t = time.perf_counter()\n"
        "import mgpu_edu\n"
        "from mgpu_edu import check, course, source\n"
        "print(time.perf_counter() - t)\n"
        "print('tensorflow' in sys.modules, 'keras' in sys.modules)\n"
    )
    assert out.returncode == 0, out.stderr
    seconds, loaded = out.stdout.splitlines()
    assert loaded == "False False"
    print(f"import mgpu_edu took {float(seconds):.3f} s (budget 0.3 s; measured, not asserted)")


@pytest.mark.processes
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


@pytest.mark.light  # starts processes, none of which imports TensorFlow
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


MODULES = sorted(m.name for m in pkgutil.walk_packages(mgpu_edu.__path__, "mgpu_edu.")
                 if not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.light)
                                  if name.endswith(".processes")
                                  else name for name in MODULES])  # its examples start new processes
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
    assert "mgpu_edu.runtime.devices.default_memory_limit_mb" in source._repr_html_()
    with pytest.raises(TypeError, match="can't find source code"):
        show_source(42)


def _package_imports() -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports (at the top or inside a function)."""
    import ast
    from pathlib import Path

    root = Path(mgpu_edu.__file__).parent
    graph = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mgpu_edu"):
                for alias in node.names:  # `from mgpu_edu.runtime import quiet` names a module too
                    child = f"{node.module}.{alias.name}"
                    found.add(child if (root.parent / child.replace(".", "/")).with_suffix(".py").exists()
                              else node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("mgpu_edu"))
        graph[name] = found - {name}
    return graph


def test_the_package_has_no_import_circle():
    graph = _package_imports()
    # a subpackage's __init__ only gathers its modules: a module importing it means importing what it gathers
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for child in sorted(graph.get(name, ())):
            if child == "mgpu_edu":  # the top-level re-exports: see the next test
                continue
            if state.get(child) == "open":
                raise AssertionError(f"import circle: {' -> '.join([*path[path.index(child):], child])}")
            if child not in state:
                visit(child, [*path, child])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_modules_import_each_other_by_their_place_not_by_short_name():
    """Inside the package, `from mgpu_edu import quiet` would go through the package's lazy re-exports (and
    hide a circle from the test above): modules name their subpackage instead."""
    import ast
    from pathlib import Path

    root = Path(mgpu_edu.__file__).parent
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "mgpu_edu":
                short = [a.name for a in node.names if a.name in mgpu_edu.MODULES]
                assert not short, f"{path.relative_to(root.parent)} imports {short} from mgpu_edu: name the subpackage"


def test_every_module_has_its_short_name():
    """`from mgpu_edu import allreduce, check, viz`: each module of a subpackage, by its own name."""
    found = {name.rsplit(".", 1)[1]: name.rsplit(".", 2)[1] for name in MODULES if name.count(".") == 2}
    del found["manifest"]  # its names are the course subpackage's own: `from mgpu_edu import course`
    assert found == mgpu_edu.MODULES
    for short, package in mgpu_edu.MODULES.items():
        assert getattr(mgpu_edu, short) is importlib.import_module(f"mgpu_edu.{package}.{short}")
    with pytest.raises(AttributeError, match="no attribute 'allreduse'"):
        mgpu_edu.allreduse  # noqa: B018
