"""The offline guard is active in this run, in lesson kernels and in subprocesses, and blocks the network."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

TRY_DOWNLOAD = textwrap.dedent("""
    import urllib.request
    try:
        urllib.request.urlopen("http://example.com/data.npz", timeout=5)
    except OSError as error:
        print("refused:", error)
""")


@pytest.fixture
def private_log(tmp_path, monkeypatch):
    """A log of its own for one test, so its deliberate attempts don't fail the session."""
    log = tmp_path / "network.log"
    monkeypatch.setenv("MGPU_EDU_NETWORK_LOG", str(log))
    return log


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_subprocesses_are_refused_and_logged(private_log):
    done = subprocess.run([sys.executable, "-c", TRY_DOWNLOAD], capture_output=True, text=True, check=True)
    assert "mgpu_edu offline guard: network access to 'example.com' blocked" in done.stdout
    assert "example.com" in private_log.read_text()


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_a_sitecustomize_later_on_the_path_still_runs(private_log, tmp_path):
    """The guard is the first sitecustomize on PYTHONPATH; one after it (a system's, or a GPU run's) runs as well."""
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.LATER_SITECUSTOMIZE = 'ran'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.environ["PYTHONPATH"], str(tmp_path)]))
    code = TRY_DOWNLOAD + "import builtins\nprint('later:', getattr(builtins, 'LATER_SITECUSTOMIZE', 'not run'))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, timeout=60)
    assert "network access to 'example.com' blocked" in done.stdout  # the guard still runs first
    assert "later: ran" in done.stdout, done.stdout + done.stderr


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_direct_connections_to_other_hosts_are_refused(private_log):
    code = ("import socket\ns = socket.socket()\n"
            "try:\n    s.connect(('192.0.2.1', 80))\nexcept OSError as e:\n    print(e)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert "'192.0.2.1:80' blocked" in done.stdout


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_loopback_still_works(private_log):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('localhost', {port}), timeout=5).close()\nprint('ok')"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.strip() == "ok", done.stderr
    assert not private_log.exists()


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_lesson_kernels_run_guarded(private_log):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import sitecustomize\nprint(sitecustomize.GUARD)"),
        nbformat.v4.new_code_cell(TRY_DOWNLOAD)])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    assert nb.cells[0].outputs[0].text.strip() == "mgpu_edu offline guard"
    assert "blocked" in nb.cells[1].outputs[0].text


def test_the_test_process_itself_is_guarded(private_log):
    guard = Path(__file__).resolve().parent / "offline"
    assert str(guard) in os.environ["PYTHONPATH"].split(os.pathsep)
    with pytest.raises(OSError, match="offline guard"):
        urllib.request.urlopen("https://pypi.org/simple/", timeout=5)
    assert "pypi.org" in private_log.read_text()


DIRTY_TEST = '''
import socket, subprocess, sys
from pathlib import Path

def test_dirty():
    Path("left-behind.txt").write_text("a lesson should not write here")
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        socket.create_connection(("example.org", 80), timeout=5)
    except OSError:
        pass  # caught: the run must fail anyway
'''


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_a_run_that_leaves_files_processes_or_touches_the_network_fails(tmp_path):
    root = Path(__file__).resolve().parents[1]
    shutil.copy(root / "conftest.py", tmp_path / "conftest.py")
    shutil.copytree(root / "tests" / "offline", tmp_path / "tests" / "offline",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "test_dirty.py").write_text(DIRTY_TEST)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MGPU_EDU_NETWORK_LOG")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_dirty.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == 1, done.stdout
    assert "1 passed" in done.stdout and "This run was not offline and clean" in done.stdout
    assert "network access attempted" in done.stdout and "example.org" in done.stdout
    assert "left a file in the checkout: left-behind.txt" in done.stdout
    assert "left a process running" in done.stdout and "time.sleep(120)" in done.stdout
