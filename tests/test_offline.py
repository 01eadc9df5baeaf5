"""The offline guard is active in this run, in lesson kernels and in subprocesses, and blocks the network."""

from __future__ import annotations

import os
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


def test_subprocesses_are_refused_and_logged(private_log):
    done = subprocess.run([sys.executable, "-c", TRY_DOWNLOAD], capture_output=True, text=True, check=True)
    assert "mgpu_edu offline guard: network access to 'example.com' blocked" in done.stdout
    assert "example.com" in private_log.read_text()


def test_direct_connections_to_other_hosts_are_refused(private_log):
    code = ("import socket\ns = socket.socket()\n"
            "try:\n    s.connect(('192.0.2.1', 80))\nexcept OSError as e:\n    print(e)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert "'192.0.2.1:80' blocked" in done.stdout


def test_loopback_still_works(private_log):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('localhost', {port}), timeout=5).close()\nprint('ok')"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.stdout.strip() == "ok", done.stderr
    assert not private_log.exists()


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
