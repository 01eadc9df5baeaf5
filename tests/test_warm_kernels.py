"""tests/warm_kernels.py: a kernel forked from a process that has imported TensorFlow does what a kernel its
Jupyter client started itself does (make test's Colab-like lessons and nbgrader's student versions run in them).

Each test asks the real thing: Jupyter's own client starts, interrupts, kills and shuts the kernel down, and a
training step in a forked kernel gives the loss a fresh Python gives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import nbformat
import psutil
import pytest
from jupyter_client import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from warm_kernels import NOTEBOOK_VARIABLE, SUPPORTED, warm_kernels

pytestmark = [pytest.mark.processes,
              pytest.mark.skipif(not SUPPORTED, reason="kernels are forked on Linux only (tests/warm_kernels.py)")]

# A step of training on four logical CPUs under MirroredStrategy; prints the loss (the same code in a fresh
# Python and in a forked kernel).
TRAIN = """
import mgpu_edu
mgpu_edu.setup_devices({devices})
import keras, numpy as np, tensorflow as tf
keras.utils.set_random_seed(0)
strategy = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
history = model.fit(x, x.sum(axis=1, keepdims=True), batch_size=16, epochs=2, verbose=0)
print(repr([float(v) for v in history.history["loss"]]), strategy.num_replicas_in_sync)
"""


STARTS = "import sys\nprint('tensorflow' in sys.modules)"  # before any line of the notebook imported it


@pytest.fixture(scope="module")
def zygote():
    with warm_kernels():
        yield


def start(**options):
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(**options)
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=300)
    return manager, client


def run(client, code: str, timeout: float = 300) -> tuple[str, dict]:
    """Run code in the kernel: what it printed, and the execute reply's content."""
    printed: list[str] = []

    def output(message):
        if message["msg_type"] == "stream":
            printed.append(message["content"]["text"])

    reply = client.execute_interactive(code, output_hook=output, timeout=timeout)
    return "".join(printed), reply["content"]


def gone(pid: int, within_s: float = 120) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


def test_a_forked_kernel_has_the_clients_folder_and_environment_and_trains_as_a_fresh_python(zygote, tmp_path):
    manager, client = start(cwd=str(tmp_path), env={**os.environ, "MGPU_EDU_TEST_MARK": "from the client"})
    try:
        printed, reply = run(client, """
import json, os, sys, psutil
print(json.dumps({"cwd": os.getcwd(), "mark": os.environ.get("MGPU_EDU_TEST_MARK"),
                  "tensorflow": "tensorflow" in sys.modules, "pid": os.getpid(), "pgid": os.getpgid(0),
                  "parent": psutil.Process().parent().cmdline()}))
""")
        assert reply["status"] == "ok", reply
        seen = json.loads(printed)
        assert seen["cwd"] == str(tmp_path)
        assert seen["mark"] == "from the client"
        # TensorFlow came with the fork (no line of the kernel's imported it); the zygote is its parent; the
        # kernel leads a process group of its own, as a kernel a client starts does
        assert seen["tensorflow"] and seen["parent"][-2] == "serve" and seen["pid"] == seen["pgid"]
        assert manager.provisioner.process.pid != seen["pid"]  # the client's process is the launcher

        printed, reply = run(client, TRAIN.format(devices=4))
        assert reply["status"] == "ok", reply
    finally:
        manager.shutdown_kernel()
    fresh = subprocess.run([sys.executable, "-c", TRAIN.format(devices=4)], capture_output=True, text=True,
                           timeout=600, check=True)
    assert printed.split() == fresh.stdout.split() and printed.split()[-1] == "4", (printed, fresh.stdout)


def test_each_forked_kernel_sets_up_its_own_devices(zygote):
    manager, client = start()
    try:
        printed, reply = run(client, "import mgpu_edu\nmgpu_edu.setup_devices(2)\nimport tensorflow as tf\n"
                                     "print(len(tf.config.list_logical_devices('CPU')))")
        assert reply["status"] == "ok", reply
        assert printed.split()[-1] == "2"  # the zygote set up no devices: this kernel chose two (the first, four)
    finally:
        manager.shutdown_kernel()


def test_a_shutdown_ends_the_kernel_and_the_launcher_exits_as_it_did(zygote):
    manager, client = start()
    printed, _ = run(client, "import os; print(os.getpid())")
    launcher = manager.provisioner.process  # the client's own handle on the process it started
    # time to end on a busy machine: after half of it the client sends SIGTERM, which the kernel would then
    # end by (and its launcher with it, as it should)
    manager.shutdown_wait_time = 600
    manager.shutdown_kernel()
    assert gone(int(printed)) and launcher.returncode == 0


def test_a_kernel_killed_by_a_signal_ends_its_launcher_by_the_same_signal(zygote):
    manager, client = start()
    printed, _ = run(client, "import os; print(os.getpid())")
    launcher = manager.provisioner.process
    os.kill(int(printed), 9)  # as the out-of-memory killer would
    assert launcher.wait(timeout=120) == -9
    client.stop_channels()
    manager.cleanup_resources()


def test_an_interrupt_reaches_the_running_cell(zygote):
    manager, client = start()
    try:
        message = client.execute("import time\nprint('running', flush=True)\nfor _ in range(600): time.sleep(0.1)")
        while True:  # interrupt once the cell runs (an idle kernel ignores SIGINT)
            output = client.get_iopub_msg(timeout=120)
            if output["msg_type"] == "stream" and "running" in output["content"]["text"]:
                break
        manager.interrupt_kernel()
        reply = client.get_shell_msg(timeout=120)
        while reply["parent_header"]["msg_id"] != message:  # the replies wait_for_ready left unread
            reply = client.get_shell_msg(timeout=120)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        # the kernel lives on, as after any interrupt: it runs the next cell to its result, read from the result's
        # own message (stdout goes out from ipykernel's flushing thread, and once, right after the interrupt, the
        # client read none of it)
        results: list[str] = []
        for _ in range(10):  # ipykernel aborts a request that arrives while it still clears its queue after an error
            reply = client.execute_interactive("6 * 7", timeout=300, output_hook=lambda m: results.append(
                m["content"]["data"]["text/plain"]) if m["msg_type"] == "execute_result" else None)
            if reply["content"]["status"] != "aborted":
                break
        assert reply["content"]["status"] == "ok" and results == ["42"]
    finally:
        manager.shutdown_kernel()


def test_killing_the_launcher_ends_the_kernel_even_while_it_computes(zygote):
    manager, client = start()
    printed, _ = run(client, "import os; print(os.getpid())")
    client.execute("sum(range(10**11))")  # holds the kernel's interpreter for minutes
    time.sleep(1)
    manager.shutdown_kernel(now=True)  # SIGKILL to the client's process (its process group), which can't pass it on
    assert gone(int(printed))


def test_each_forked_kernel_draws_its_own_random_numbers(zygote):
    draws = []
    for _ in range(2):
        manager, client = start()
        try:
            printed, _ = run(client, "import numpy as np, random\nprint(np.random.rand(), random.random())")
        finally:
            manager.shutdown_kernel()
        draws.append(printed.split())
    assert draws[0][0] != draws[1][0] and draws[0][1] != draws[1][1]


def test_a_client_that_sets_a_start_up_variable_otherwise_gets_a_fresh_kernel(zygote):
    """MGPU_EDU_TF_LOGS=1 asks for TensorFlow's start-up lines, which only an import after it can show."""
    manager, client = start(env={**os.environ, "MGPU_EDU_TF_LOGS": "1"})
    try:
        printed, _ = run(client, STARTS)
    finally:
        manager.shutdown_kernel()
    assert printed == "False\n"


def test_a_kernel_whose_client_dies_ends(zygote):
    client = subprocess.Popen([sys.executable, "-c", """
from jupyter_client import KernelManager
manager = KernelManager(kernel_name="python3")
manager.start_kernel()
client = manager.client()
client.start_channels()
client.wait_for_ready(timeout=300)
print(client.execute_interactive("import os; print(os.getpid())", output_hook=lambda m: print(
    m["content"].get("text", ""), end="", flush=True), timeout=300) and "", flush=True)
import time; time.sleep(600)
"""], stdout=subprocess.PIPE, text=True)
    try:
        kernel = int(client.stdout.readline())
        launcher = next(p for p in psutil.Process(client.pid).children() if "kernel" in p.cmdline())
        client.kill()  # the client dies without shutting its kernel down
        assert gone(launcher.pid) and gone(kernel)  # the launcher saw it and ended the kernel
    finally:
        client.kill()
        client.wait()


def test_a_failing_cell_fails_the_notebook_and_the_network_stays_blocked(zygote, tmp_path, monkeypatch):
    log = tmp_path / "network.log"  # a log of its own (tests/test_offline.py), read from the client's environment
    monkeypatch.setenv("MGPU_EDU_NETWORK_LOG", str(log))
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell(
        "import socket\ntry:\n    socket.create_connection(('example.com', 80), timeout=5)\n"
        "except OSError as error:\n    print(error)"), nbformat.v4.new_code_cell("assert 1 == 2, 'broken on purpose'")]
    with pytest.raises(CellExecutionError, match="broken on purpose"):
        NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    assert "offline guard" in nb.cells[0].outputs[0]["text"]  # the guard, set up in the zygote, came with the fork
    assert "example.com" in log.read_text()


def notebook(*sources: str):
    return nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        cells=[nbformat.v4.new_code_cell(source) for source in sources])




def test_a_notebook_that_must_run_before_tensorflows_import_gets_a_fresh_kernel(zygote, tmp_path, monkeypatch):
    """meshes.record_collectives sets variables TensorFlow reads as it loads: in a forked kernel it refuses, so a
    notebook that calls it gets a kernel started as usual, whether nbval names it or it is alone in its folder."""
    forked = notebook(STARTS, "from mgpu_edu import meshes\ngetattr(meshes, 'record_' + 'collectives')()")
    with pytest.raises(CellExecutionError, match="must run before TensorFlow starts"):
        NotebookClient(forked, timeout=300, kernel_name="python3").execute()
    assert forked.cells[0].outputs[0]["text"] == "True\n"

    lessons = tmp_path / "lessons"  # several notebooks in the folder, as nbval runs lessons/: it names the one
    lessons.mkdir()
    nbformat.write(notebook("print(1)"), lessons / "other.ipynb")
    fresh = notebook(STARTS, "from mgpu_edu import meshes\nprint(meshes.record_collectives().is_dir())")
    nbformat.write(fresh, lessons / "mesh.ipynb")
    monkeypatch.setenv(NOTEBOOK_VARIABLE, str(lessons / "mesh.ipynb"))
    NotebookClient(fresh, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(lessons)}}).execute()
    assert [cell.outputs[0]["text"] for cell in fresh.cells] == ["False\n", "True\n"]

    alone = tmp_path / "graded"  # one notebook in the kernel's folder, as nbgrader runs each
    alone.mkdir()
    nbformat.write(fresh, alone / "mesh.ipynb")
    monkeypatch.delenv(NOTEBOOK_VARIABLE)
    NotebookClient(fresh, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(alone)}}).execute()
    assert [cell.outputs[0]["text"] for cell in fresh.cells] == ["False\n", "True\n"]
