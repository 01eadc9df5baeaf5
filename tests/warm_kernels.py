"""Lesson kernels forked from a process that has imported TensorFlow and Keras already.

A lesson kernel's first cell imports TensorFlow and Keras before its first line of its own (7.7
CPU-seconds in one process beside a test run here); ``make test`` starts some forty kernels. Where a run
only needs each lesson's cells to run in the right environment (the Colab-like lessons, the student versions
under nbgrader), each kernel is instead forked from one process that has done those imports (a zygote, as
Android starts its apps). The Binder-like lessons, whose times and memory are the budget table, and
JupyterLab's kernels keep starting as a learner's do.

How a kernel starts here:

- :func:`warm_kernels` starts the zygote (``python warm_kernels.py serve FD``, listening on a socket it
  made), waits until it has imported, and writes a kernel spec named ``python3`` whose command is this file's
  launcher (``python warm_kernels.py kernel -f CONNECTION``); with ``JUPYTER_PATH`` pointing at it, every
  Jupyter client (nbval, nbgrader) starts that one.
- The zygote imports what a kernel's first cells would (``mgpu_edu``'s quiet TensorFlow import, then Keras),
  with ``MPLBACKEND`` set as ipykernel sets it (TensorFlow's import loads matplotlib) and nothing else: no
  device is set up, so each kernel still chooses its own layout (logical CPUs or GPUs).
- The launcher, which the Jupyter client started and watches, sends the zygote its arguments, environment,
  folder and standard streams. The zygote forks; the child starts a session of its own, tells the launcher
  its pid, takes the streams, folder and environment and runs ipykernel as ``python -m ipykernel_launcher``
  would. The launcher passes on the signals a client sends a kernel (``RELAYED``: SIGINT for an interrupt,
  SIGTERM, ...) to the kernel's process group, as the client would have sent them to a kernel it started,
  and exits as the kernel exited (its status, or the same signal).
- If the launcher is killed (SIGKILL can't be passed on), the zygote sees its connection close and kills the
  kernel's process group, busy or not; if the client that started the launcher dies, the launcher kills it,
  as ipykernel's parent poller would have. If the zygote's own parent dies, it kills its kernels and ends.

A kernel is started as a client starts one (the launcher execs ``python -m ipykernel_launcher``) where a fork
could differ from it:

- a notebook that calls something that must run before TensorFlow is imported (``BEFORE_TENSORFLOW``:
  ``meshes.record_collectives`` sets variables TensorFlow reads as it loads). The launcher reads the notebook
  ``MGPU_EDU_KERNEL_NOTEBOOK`` names (the root ``conftest.py`` sets it for each notebook nbval runs) or else
  the one notebook in the kernel's folder (nbgrader runs each in a folder of its own);
- a client whose environment differs from the zygote's in a variable read as Python, TensorFlow, Keras,
  matplotlib or a maths library starts (``STARTUP_VARIABLES``: ``PYTHONHASHSEED``, ``TF_*``, ``MGPU_EDU_TF_LOGS``,
  ``TMPDIR``, ``LANG``, ...).

Otherwise the kernel's environment is the launcher's, plus what the zygote's imports added and the client
didn't set (``mgpu_edu`` sets ``TF_CPP_MIN_LOG_LEVEL`` as it imports TensorFlow): a fresh kernel's
environment after its first cells. NumPy's global random generator is reseeded from the OS and ``tempfile``
looks for its folder again, as in a fresh process. One difference stays: every forked kernel of a run shares
the zygote's string-hash seed, so an output that depends on the order of a set of strings varies between runs,
not between the kernels of one run (a lesson must not print one under ``NBVAL_CHECK_OUTPUT`` either way).

Linux 5.3 or later only (``pidfd_open``): elsewhere :func:`warm_kernels` changes nothing and kernels start as
usual (on macOS a process that has loaded Apple's frameworks must not fork without exec).
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
STOP_GRACE_S = 30  # how long a stopped zygote waits for its kernels to end before it kills them
READY_TIMEOUT_S = 600  # how long warm_kernels() waits for the zygote's imports
#: Calls that must come before TensorFlow's import: a notebook that makes one gets a fresh kernel.
BEFORE_TENSORFLOW = ("record_collectives(",)
#: Variables read as Python, TensorFlow, Keras, matplotlib or a maths library start: a client that sets one
#: otherwise than the zygote had it gets a fresh kernel (names, and prefixes ending in "_" or "*").
STARTUP_VARIABLES = ("PYTHON*", "TF_", "XLA_", "KERAS_", "MPL*", "OMP_", "OPENBLAS_", "MKL_", "LANG", "LC_",
                     "HOME", "TMPDIR", "CUDA_", "MGPU_EDU_TF_LOGS")


def _startup_variable(name: str) -> bool:
    return any(name.startswith(p.rstrip("*")) if p.endswith(("_", "*")) else name == p for p in STARTUP_VARIABLES)


def _supported() -> bool:
    if sys.platform != "linux":
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


SUPPORTED = _supported()


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


# ----- the launcher: the process a Jupyter client starts as its kernel -------------------------------------
def _fresh_kernel(argv: list[str]) -> None:
    """Become the kernel a client starts from ipykernel's own spec."""
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *argv])


def launch(argv: list[str]) -> int:
    """Ask the zygote for a kernel with these ipykernel arguments; pass signals on; return its exit status."""
    notebook = _notebook()
    if notebook and needs_fresh_kernel(notebook):
        _fresh_kernel(argv)
    path = os.environ.get(SOCKET_VARIABLE)
    if not path:
        sys.exit(f"{SOCKET_VARIABLE} is not set: start kernels through warm_kernels() (tests/warm_kernels.py)")
    parent = os.getppid()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    _send(conn, {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}, [0, 1, 2])
    started, _ = _receive(conn)
    if started is None:
        sys.exit("the kernel zygote (tests/warm_kernels.py) closed the connection before the kernel started")
    if started.get("fresh"):
        conn.close()
        _fresh_kernel(argv)
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
    if os.WIFSIGNALED(status):  # end as the kernel ended: by the same signal, without a second core file
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if os.WTERMSIG(status) not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    return os.waitstatus_to_exitcode(status)


# ----- the zygote ------------------------------------------------------------------------------------------
_ENV_AT_START = dict(os.environ)


def _differs(env: dict[str, str]) -> list[str]:
    """The start-up variables the client's environment has otherwise than the zygote's."""
    names = {n for n in (*env, *_ENV_AT_START) if _startup_variable(n)}
    return sorted(n for n in names if env.get(n) != _ENV_AT_START.get(n))


def _become_kernel(conn: socket.socket, request: dict, fds: list[int], zygotes: list) -> None:
    """In the forked child: take the launcher's streams, folder and environment and run ipykernel."""
    os.setsid()  # a process group of its own, as a client's kernel has (start_new_session)
    _send(conn, {"pid": os.getpid()})  # after setsid, so a signal the launcher passes on finds the group
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for thing in zygotes:  # the zygote's listener, selector, wake-up pipe, other kernels' connections, pidfds
        thing.close() if hasattr(thing, "close") else os.close(thing)
    conn.close()  # the zygote holds its end: it kills this kernel if the launcher goes
    added = {k: v for k, v in os.environ.items() if k not in _ENV_AT_START}
    os.environ.clear()
    os.environ.update({**added, **request["env"]})
    os.chdir(request["cwd"])
    sys.path[0] = os.getcwd()  # as `python -m` sets it
    import tempfile

    import numpy  # imported with TensorFlow

    tempfile.tempdir = None  # found again from this environment (TMPDIR), as a fresh process finds it
    numpy.random.seed()  # seeded from the OS, as a fresh process seeds it (the standard `random` reseeds itself)
    import runpy

    sys.argv = ["ipykernel_launcher", *request["argv"]]
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
    sys.exit()  # as the interpreter ends after `python -m ipykernel_launcher`, never back in the zygote's loop


def serve(listening_fd: int) -> None:
    """Import what every kernel imports first, say "ready", then fork a kernel for each launcher that connects.

    The listening socket comes ready from :func:`warm_kernels`.
    """
    import selectors
    import time
    import warnings

    parent = os.getppid()
    # ipykernel sets MPLBACKEND before a kernel's first cell, and TensorFlow's import loads matplotlib.
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    from mgpu_edu.runtime.quiet import import_tensorflow

    import_tensorflow()
    import keras  # noqa: F401

    # Not ipykernel: its defaults read the client's variables (JPY_PARENT_PID) as it is imported.
    print("ready", flush=True)
    null = os.open(os.devnull, os.O_WRONLY)  # nobody reads the pipe after that line
    os.dup2(null, 1)
    os.close(null)
    listener = socket.socket(fileno=listening_fd)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listener")
    # SIGTERM (the end of warm_kernels()): no new kernel; the zygote ends once its kernels have (the last one
    # nbval stops may still be ending), so none is left behind and each one's CPU time is counted
    wake, woken = os.pipe()
    os.set_blocking(woken, False)
    signal.set_wakeup_fd(woken)
    selector.register(wake, selectors.EVENT_READ, "wake")
    stopped: list[float] = []
    signal.signal(signal.SIGTERM, lambda *_: stopped or stopped.append(time.monotonic()))
    kernels: dict[int, tuple[socket.socket, int]] = {}  # pidfd: (the launcher's connection, pid)

    def kill(pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    while not stopped or kernels:
        if os.getppid() != parent:  # whoever started the zygote is gone: so are its kernels
            for _conn, pid in kernels.values():
                kill(pid)
            stopped.append(0.0)
        if stopped and listener.fileno() != -1:
            selector.unregister(listener)
            listener.close()
        left = 1.0 if not stopped else min(1.0, stopped[0] + STOP_GRACE_S - time.monotonic())
        if left <= 0:
            break
        for key, _ in selector.select(left):
            if key.data == "wake":
                os.read(wake, 512)
            elif key.data == "listener":
                conn, _ = listener.accept()
                request, fds = _receive(conn, max_fds=3)
                if request is None or len(fds) != 3:
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                if _differs(request["env"]):
                    with contextlib.suppress(OSError):
                        _send(conn, {"fresh": True})
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                with warnings.catch_warnings():  # os.fork() warns where a process has other threads: here
                    # OpenBLAS's, which reinitialises itself in the child (pthread_atfork)
                    warnings.filterwarnings("ignore", message=".*fork", category=DeprecationWarning)
                    pid = os.fork()
                if pid == 0:  # the kernel; ends by SystemExit, out of this loop, as a process ends
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    _become_kernel(conn, request, fds, [listener, selector, wake, woken, *kernels,
                                                        *(c for c, _ in kernels.values())])
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                kernels[pidfd] = (conn, pid)
                selector.register(pidfd, selectors.EVENT_READ, "kernel")
                selector.register(conn, selectors.EVENT_READ, pidfd)
            elif key.data == "kernel":  # a kernel ended: tell its launcher how
                conn, pid = kernels.pop(key.fd)
                selector.unregister(key.fd)
                with contextlib.suppress(KeyError):  # unless its end was seen first
                    selector.unregister(conn)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):
                    _send(conn, {"status": status})
                conn.close()
            elif key.data in kernels:  # a launcher's connection: it sends nothing more, so this is its end
                with contextlib.suppress(OSError):  # (killed): end its kernel, busy or not
                    if key.fileobj.recv(1):
                        continue
                selector.unregister(key.fileobj)
                kill(kernels[key.data][1])
    for _conn, pid in kernels.values():  # still running STOP_GRACE_S after the stop
        kill(pid)
        os.waitpid(pid, 0)


@contextlib.contextmanager
def warm_kernels():
    """Inside the block, Jupyter clients of this process and its children start ``python3`` kernels forked
    from a zygote that runs this Python; the zygote is stopped at the end. Where forking isn't supported
    (``SUPPORTED``), nothing changes."""
    if not SUPPORTED:
        yield
        return
    import select
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
        # a session of its own, so a Ctrl-C meant for pytest doesn't reach it; it ends with its parent anyway
        zygote = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", str(listener.fileno())],
                                  pass_fds=[listener.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  start_new_session=True)
        listener.close()
        try:
            ready, _, _ = select.select([zygote.stdout], [], [], READY_TIMEOUT_S)
            if not ready or zygote.stdout.readline() != b"ready\n":
                zygote.kill()
                raise RuntimeError(f"the kernel zygote (tests/warm_kernels.py) did not import TensorFlow and Keras "
                                   f"within {READY_TIMEOUT_S} s (exit status {zygote.wait()}); its errors are above")
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
        finally:
            zygote.terminate()
            zygote.wait(timeout=STOP_GRACE_S + 30)
            zygote.stdout.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["kernel"]:
        sys.exit(launch(sys.argv[2:]))
    elif sys.argv[1:2] == ["serve"] and len(sys.argv) == 3:
        serve(int(sys.argv[2]))
    else:
        sys.exit("usage: warm_kernels.py serve LISTENING-FD | kernel IPYKERNEL-ARGUMENTS")
