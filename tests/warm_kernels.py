"""Lesson kernels forked from a process that has imported TensorFlow and Keras already.

A lesson kernel's first cell spends about 4 CPU-seconds importing TensorFlow and Keras before its first
line of its own; ``make test`` starts some forty kernels. Where a run only needs each lesson's cells to run
in the right environment (the Colab-like lessons, the student versions under nbgrader), each kernel is
instead forked from one process that has done those imports (a zygote, as Android starts its apps). The
Binder-like lessons, whose times and memory are the budget table, and JupyterLab's kernels keep starting as
a learner's do.

How a kernel starts here:

- :func:`warm_kernels` starts the zygote (``python warm_kernels.py serve SOCKET``) and writes a kernel spec
  named ``python3`` whose command is this file's launcher (``python warm_kernels.py kernel -f CONNECTION``);
  with ``JUPYTER_PATH`` pointing at it, every Jupyter client (nbval, nbgrader) starts that one.
- The zygote imports what a kernel's first cells would (``mgpu_edu``'s quiet TensorFlow import, then Keras),
  with ``MPLBACKEND`` set as ipykernel sets it (TensorFlow's import loads matplotlib) and nothing else: no
  device is set up, so each kernel still chooses its own layout (logical CPUs or GPUs).
- The launcher, which the Jupyter client started and watches, sends the zygote its arguments, environment,
  folder and standard streams. The zygote forks; the child takes them, starts a session of its own and runs
  ipykernel as ``python -m ipykernel_launcher`` would. The launcher passes on every signal it gets (to the
  kernel's process group, as the client would have sent it to a kernel it started) and exits with the
  kernel's exit status, so the client sees one kernel process that lives exactly as long as the kernel.
- If the launcher is killed (SIGKILL can't be passed on), the kernel sees its connection close and kills
  itself; if the client that started the launcher dies, the launcher kills the kernel, as ipykernel's parent
  poller would have.

A notebook that calls a function which must run before TensorFlow is imported (``BEFORE_TENSORFLOW``:
``meshes.record_collectives`` sets variables TensorFlow reads as it loads) gets a kernel started as a client
starts one: the launcher becomes ``python -m ipykernel_launcher`` (exec). The launcher reads the notebook
``MGPU_EDU_KERNEL_NOTEBOOK`` names (the root ``conftest.py`` sets it for each notebook nbval runs) or else the
one notebook in the kernel's folder (nbgrader runs each in a folder of its own).

The kernel's environment is the launcher's, plus the variables the zygote's imports set (``mgpu_edu`` sets
``TF_CPP_MIN_LOG_LEVEL`` as it imports TensorFlow): what a fresh kernel's environment is after its first
cells. NumPy's global random generator is reseeded from the OS, as a fresh process seeds it.

Linux only: elsewhere :func:`warm_kernels` changes nothing and kernels start as usual (on macOS a process that
has loaded Apple's frameworks must not fork without exec).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import signal
import socket
import sys

#: Signals the launcher passes on to the kernel's process group.
RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
SOCKET_VARIABLE = "MGPU_EDU_KERNEL_ZYGOTE"
NOTEBOOK_VARIABLE = "MGPU_EDU_KERNEL_NOTEBOOK"
SUPPORTED = sys.platform == "linux"
#: Calls that must come before TensorFlow's import: a notebook that makes one gets a fresh kernel.
BEFORE_TENSORFLOW = ("record_collectives(",)


def needs_fresh_kernel(notebook: str) -> bool:
    """Whether a code cell of the notebook calls something that must run before TensorFlow is imported."""
    with open(notebook, encoding="utf-8") as file:
        cells = json.load(file)["cells"]
    sources = ("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")
    return any(call in source for source in sources for call in BEFORE_TENSORFLOW)


def _notebook() -> str | None:
    """The notebook this kernel is for, where the client says or the kernel's folder shows."""
    named = os.environ.get(NOTEBOOK_VARIABLE)
    if named:
        return named
    here = [name for name in os.listdir() if name.endswith(".ipynb")]
    return here[0] if len(here) == 1 else None


# ----- the launcher: the process a Jupyter client starts as its kernel -------------------------------------
def _send(conn: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode() + b"\n"
    if fds:
        conn.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        conn.sendall(data)


def _receive(conn: socket.socket, max_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One newline-ended JSON message (None at end of stream), with the descriptors sent alongside it."""
    data, fds = b"", []
    while not data.endswith(b"\n"):
        if max_fds and not fds:
            chunk, fds, _, _ = socket.recv_fds(conn, 1 << 16, max_fds)
        else:
            chunk = conn.recv(1 << 16)
        if not chunk:
            return None, fds
        data += chunk
    return json.loads(data), fds


def launch(argv: list[str]) -> int:
    """Ask the zygote for a kernel with these ipykernel arguments; pass signals on; return its exit status."""
    notebook = _notebook()
    if notebook and needs_fresh_kernel(notebook):  # this process becomes the kernel, as the client would start it
        os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *argv])
    path = os.environ.get(SOCKET_VARIABLE)
    if not path:
        sys.exit(f"{SOCKET_VARIABLE} is not set: start kernels through warm_kernels() (tests/warm_kernels.py)")
    parent = os.getppid()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    _send(conn, {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}, [0, 1, 2])
    started, _ = _receive(conn)
    if started is None:
        sys.exit("the zygote closed the connection before starting the kernel")
    pid = started["pid"]

    def relay(signum, _frame):
        try:
            os.killpg(pid, signum)
        except ProcessLookupError:
            pass

    for signum in RELAYED:
        signal.signal(signum, relay)
    conn.settimeout(1.0)
    while True:
        try:
            ended, _ = _receive(conn)
            break
        except TimeoutError:
            if os.getppid() != parent:  # the client is gone: end the kernel, as its parent poller would
                relay(signal.SIGKILL, None)
        except InterruptedError:
            continue
    if ended is None:
        return 1
    status = ended["status"]
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    return os.waitstatus_to_exitcode(status)


# ----- the zygote ------------------------------------------------------------------------------------------
def _become_kernel(conn: socket.socket, request: dict, fds: list[int], zygotes: list) -> None:
    """In the forked child: take the launcher's streams, folder and environment and run ipykernel."""
    os.setsid()  # a process group of its own, as a client's kernel has (start_new_session)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for thing in zygotes:  # the zygote's listener, selector, other kernels' connections and pidfds
        thing.close() if hasattr(thing, "close") else os.close(thing)
    added = {k: v for k, v in os.environ.items() if k not in _ENV_AT_START}
    os.environ.clear()
    os.environ.update({**request["env"], **added})
    os.chdir(request["cwd"])
    sys.path[0] = os.getcwd()  # as `python -m` sets it
    # A fresh process seeds NumPy's global generator from the OS; every fork would share the zygote's (the
    # standard library's `random` reseeds itself in a forked child)
    import numpy

    numpy.random.seed()

    import threading

    def watch() -> None:  # the launcher gone (killed) means the kernel must go too
        while True:
            try:
                if not conn.recv(1):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="warm-kernels-launcher-watch", daemon=True).start()
    import runpy

    sys.argv = ["ipykernel_launcher", *request["argv"]]
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
    sys.exit()  # as the interpreter ends after `python -m ipykernel_launcher`, never back in the zygote's loop


_ENV_AT_START = dict(os.environ)


def serve(listening_fd: int) -> None:
    """Import what every kernel imports first, then fork a kernel for each launcher that connects.

    The listening socket comes ready from :func:`warm_kernels`, so launchers can connect (and wait in its
    backlog) while these imports run.
    """
    import selectors
    import warnings

    # os.fork() warns where a process has threads besides its own: here OpenBLAS's, which reinitialises
    # itself in the child (pthread_atfork)
    warnings.filterwarnings("ignore", message=".*use of fork\\(\\) may lead to deadlocks", category=DeprecationWarning)

    # ipykernel sets MPLBACKEND before a kernel's first cell, and TensorFlow's import loads matplotlib.
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    from mgpu_edu.runtime.quiet import import_tensorflow

    import_tensorflow()
    import keras  # noqa: F401

    # Not ipykernel: its defaults read the client's variables (JPY_PARENT_PID) as it is imported.

    listener = socket.socket(fileno=listening_fd)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, tuple[socket.socket, int]] = {}  # pidfd: (connection, pid)
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                request, fds = _receive(conn, max_fds=3)
                if request is None or len(fds) != 3:
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:  # the kernel; ends by SystemExit, out of this loop, as a process ends
                    _become_kernel(conn, request, fds, [listener, selector, *children,
                                                        *(c for c, _ in children.values())])
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (conn, pid)
                selector.register(pidfd, selectors.EVENT_READ)
                _send(conn, {"pid": pid})
            else:
                pidfd = key.fd
                conn, pid = children.pop(pidfd)
                selector.unregister(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                try:
                    _send(conn, {"status": status})
                except OSError:
                    pass
                conn.close()


@contextlib.contextmanager
def warm_kernels():
    """Inside the block, Jupyter clients of this process and its children start ``python3`` kernels forked
    from a zygote that runs this Python; the zygote is stopped at the end. Not on Linux: nothing changes."""
    if not SUPPORTED:
        yield
        return
    import subprocess
    import tempfile

    from ipykernel.kernelspec import get_kernel_dict

    with tempfile.TemporaryDirectory(prefix="mgpu-edu-kernels-") as folder:
        spec = os.path.join(folder, "kernels", "python3")
        os.makedirs(spec)
        with open(os.path.join(spec, "kernel.json"), "w", encoding="utf-8") as file:
            json.dump({**get_kernel_dict(), "interrupt_mode": "signal",  # the spec ipykernel installs, but:
                       "argv": [sys.executable, os.path.abspath(__file__), "kernel", "-f", "{connection_file}"]}, file)
        path = os.path.join(folder, "zygote")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(64)
        zygote = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", str(listener.fileno())],
                                  pass_fds=[listener.fileno()], stdin=subprocess.DEVNULL)
        listener.close()
        saved = {name: os.environ.get(name) for name in ("JUPYTER_PATH", SOCKET_VARIABLE)}
        os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (folder, saved["JUPYTER_PATH"]) if p)
        os.environ[SOCKET_VARIABLE] = path
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            zygote.terminate()
            zygote.wait(timeout=60)


if __name__ == "__main__":
    if sys.argv[1:2] == ["kernel"]:
        sys.exit(launch(sys.argv[2:]))
    elif sys.argv[1:2] == ["serve"] and len(sys.argv) == 3:
        serve(int(sys.argv[2]))
    else:
        sys.exit("usage: warm_kernels.py serve LISTENING-FD | kernel IPYKERNEL-ARGUMENTS")
