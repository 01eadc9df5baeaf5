"""A tiny cluster of worker processes on this machine, for multi-worker lessons and tests.

:class:`LocalCluster` starts N copies of a script, each with its own ``TF_CONFIG`` naming
127.0.0.1 addresses on free ports, collects their logs, and guarantees cleanup:

- a worker that dies makes :meth:`LocalCluster.wait` raise :class:`WorkerFailed` with its
  log, instead of leaving the others hanging; every wait has a time limit;
- leaving the ``with`` block in any way (an error, an interrupted cell) kills every worker;
- on Linux each worker is also told to die with the process that started it, so even a
  killed kernel leaves no orphans.

TensorFlow's gRPC server listens on every interface of the port it is given (its ServerDef
has no bind-address setting). So where Linux allows it (``unshare`` and unprivileged user
namespaces), the workers run together in a **network namespace of their own whose only
interface is loopback**: their servers are reachable from 127.0.0.1 inside it and from nowhere
else. Elsewhere they run normally, addressed only through 127.0.0.1 (``LocalCluster.isolated``
says which).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from mgpu_edu._validate import whole_number

#: Log lines that mean a worker could not get its port (then the cluster retries with others).
PORT_ERRORS = ("Address already in use", "Could not start gRPC server", "Failed to add port")


class WorkerFailed(RuntimeError):
    """A worker process exited with an error; the message includes the end of its log."""


def free_ports(count: int) -> list[int]:
    """Ports that are free on 127.0.0.1 right now (held open together, so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def port_is_free(port: int) -> bool:
    """True if nothing listens on this port of 127.0.0.1 (or any interface)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> str:
    """The TF_CONFIG a process needs: the whole cluster, and which task this process is.

    Example:
        >>> json.loads(tf_config({"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "worker", 1))["task"]
        {'type': 'worker', 'index': 1}
    """
    if task_type not in cluster or not 0 <= index < len(cluster[task_type]):
        raise ValueError(f"task {task_type}:{index} is not in the cluster {cluster}.")
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


@functools.lru_cache(maxsize=1)
def network_isolation_available() -> bool:
    """True where workers can run in a network namespace of their own (Linux with user namespaces)."""
    exe = shutil.which("unshare")
    if not sys.platform.startswith("linux") or exe is None:
        return False
    try:
        return subprocess.run([exe, "--user", "--net", "--map-root-user", "true"], capture_output=True,
                              timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def loopback_up() -> None:
    """Bring up ``lo`` in a new network namespace (it starts down), without needing the ip tool."""
    import fcntl
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, siocgifflags, request)[:18])[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH", b"lo", flags | iff_up))


def _launch_isolated(spec_path: str) -> None:
    """Inside the new namespace: bring up loopback, start every worker, record pids and exit codes."""
    spec = json.loads(Path(spec_path).read_text())
    loopback_up()
    processes = []
    for worker in spec["workers"]:
        with open(worker["log"], "w") as log:
            processes.append(subprocess.Popen(worker["argv"], stdout=log, stderr=subprocess.STDOUT, env=worker["env"],
                                              preexec_fn=_die_with_parent))
    Path(spec["pids"]).write_text(" ".join(str(p.pid) for p in processes))
    waiting = set(range(len(processes)))
    while waiting:
        for index in list(waiting):
            code = processes[index].poll()
            if code is not None:
                Path(spec["workers"][index]["code"]).write_text(str(code))
                waiting.discard(index)
        time.sleep(0.05)


def _die_with_parent() -> None:  # runs in the child before exec (Linux only)
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    os.setpgrp()


def running(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie (Linux reads /proc; elsewhere, signal 0)."""
    if Path("/proc").is_dir():
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _wait_until_gone(pids: Sequence[int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


class LocalCluster:
    """N worker processes on 127.0.0.1, each running ``script`` with its own TF_CONFIG.

    Use it as a context manager; :meth:`wait` returns each worker's log once all exit 0.

    The workers run on the CPU: they start with ``CUDA_VISIBLE_DEVICES=""``. By default each
    TensorFlow process takes nearly all of a GPU's free memory once it uses the GPU, and the
    notebook that starts the workers may hold most of it already (``setup_devices`` gives its
    logical GPUs 80 %). On an H100, workers that used the GPU failed in their first matrix
    product ("No blas support for stream"). ``env={"CUDA_VISIBLE_DEVICES": "0",
    "TF_FORCE_GPU_ALLOW_GROWTH": "true"}`` lets them share GPU 0, taking memory as they need it;
    they can still run short if the notebook holds most of it.

    Example:
        >>> with LocalCluster("examples/multi_worker_train.py", workers=2) as c:  # doctest: +SKIP
        ...     logs = c.wait(timeout=120)
    """

    def __init__(self, script: str | Path, workers: int = 2, args: Sequence[str] = (),
                 ports: Sequence[int] | None = None, env: dict[str, str] | None = None, attempts: int = 3,
                 isolate: bool | None = None) -> None:
        whole_number("workers", workers, minimum=1, maximum=8, hint="It is worker processes on one machine.")
        self.script, self.workers, self.args = Path(script), workers, list(args)
        if not self.script.exists():
            raise FileNotFoundError(f"worker script {self.script} not found; pass the path of a Python file.")
        if ports is not None and len(ports) != workers:
            raise ValueError(f"ports={list(ports)} gives {len(ports)} ports for {workers} workers: pass one port "
                             "per worker, or leave ports out to pick free ones.")
        self.requested_ports = list(ports) if ports is not None else None
        self.env, self.attempts = dict(env or {}), attempts
        if isolate and not network_isolation_available():
            raise ValueError("isolate=True needs Linux with `unshare` and unprivileged user namespaces, which this "
                             "machine doesn't offer. Leave isolate out to use isolation where it is available.")
        #: True when the workers run in a network namespace whose only interface is loopback.
        self.isolated = network_isolation_available() if isolate is None else isolate
        self.launcher: subprocess.Popen | None = None
        self._log_dir: Path | None = None  # made when first needed: a cluster never started leaves nothing behind
        self.processes: list[subprocess.Popen] = []
        self.addresses: list[str] = []
        self.retries = 0

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.stop()
        # the logs stay only when an error leaves the `with` block (the timeouts' messages cite them); a failure
        # the caller caught inside it (as lesson 11 and the tests do on purpose) leaves nothing in the temp folder
        if exc_type is None and self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)

    @property
    def log_dir(self) -> Path:
        """The folder of the workers' logs (a fresh temporary folder, made on first use)."""
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="mgpu-cluster-"))
        return self._log_dir

    def _pick_ports(self) -> list[int]:
        if self.requested_ports and self.retries == 0:
            ports = list(self.requested_ports)
            busy = [p for p in ports if not port_is_free(p)]
            if busy:  # a busy port is swapped for a free one
                spare = iter(free_ports(len(busy)))
                ports = [next(spare) if p in busy else p for p in ports]
                self.retries += 1
            return ports
        return free_ports(self.workers)

    def start(self) -> None:
        """Start the workers (retrying with new ports if one can't bind)."""
        for _ in range(self.attempts):
            ports = self._pick_ports()
            self.addresses = [f"127.0.0.1:{p}" for p in ports]
            try:
                self._launch()
            except BaseException:
                self.stop()  # never leave half a cluster running
                raise
            if not self._port_failure(within=3.0):
                return
            self.stop()
            self.retries += 1
        raise WorkerFailed(f"could not start {self.workers} workers after {self.attempts} tries: ports were busy.")

    def _worker_env(self, index: int) -> dict[str, str]:
        return {**os.environ, "CUDA_VISIBLE_DEVICES": "", **self.env,  # on the CPU unless env says otherwise
                "TF_CONFIG": tf_config({"worker": self.addresses}, "worker", index),
                "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"), "PYTHONUNBUFFERED": "1"}

    def _launch(self) -> None:
        self.processes = []
        if self.isolated:
            self._launch_in_namespace()
            return
        for index in range(self.workers):
            env = self._worker_env(index)
            with (self.log_dir / f"worker{index}.log").open("w") as log:  # the child keeps its own copy
                self.processes.append(subprocess.Popen(
                    [sys.executable, str(self.script), *self.args], stdout=log, stderr=subprocess.STDOUT, env=env,
                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
                    start_new_session=not sys.platform.startswith("linux")))

    def _launch_in_namespace(self) -> None:
        for stale in (*self.log_dir.glob("*.code"), self.log_dir / "pids"):
            stale.unlink(missing_ok=True)
        spec = {"pids": str(self.log_dir / "pids"), "workers": [
            {"argv": [sys.executable, str(self.script.resolve()), *self.args], "env": self._worker_env(i),
             "log": str(self.log_dir / f"worker{i}.log"), "code": str(self.log_dir / f"worker{i}.code")}
            for i in range(self.workers)]}
        spec_path = self.log_dir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        package = str(Path(__file__).resolve().parents[2])  # the folder that holds mgpu_edu/
        code = f"import sys; sys.path.insert(0, {package!r}); from mgpu_edu import cluster; " \
               f"cluster._launch_isolated({str(spec_path)!r})"
        with (self.log_dir / "launcher.log").open("w") as log:
            self.launcher = subprocess.Popen(
                [shutil.which("unshare") or "unshare", "--user", "--net", "--map-root-user", sys.executable, "-c",
                 code], stdout=subprocess.DEVNULL, stderr=log, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 30
        while not (self.log_dir / "pids").exists():
            if self.launcher.poll() is not None or time.monotonic() > deadline:
                raise WorkerFailed("could not start the workers in their own network namespace: "
                                   + (self.log_dir / "launcher.log").read_text(errors="replace")[-500:])
            time.sleep(0.02)

    def _codes(self) -> list[int | None]:
        """Each worker's exit code, or None while it runs."""
        if not self.isolated:
            return [p.poll() for p in self.processes]
        codes: list[int | None] = []
        for index in range(self.workers):
            path = self.log_dir / f"worker{index}.code"
            text = path.read_text().strip() if path.exists() else ""
            codes.append(int(text) if text else None)
        if self.launcher is not None and self.launcher.poll() is not None:  # the launcher died: so did they
            codes = [-9 if code is None else code for code in codes]
        return codes

    def _port_failure(self, within: float) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            codes = self._codes()
            for index, code in enumerate(codes):
                if code not in (None, 0) and any(e in self.log(index) for e in PORT_ERRORS):
                    return True
            if all(code is not None for code in codes):
                return False
            time.sleep(0.1)
        return False

    def log(self, index: int) -> str:
        """Everything worker ``index`` has printed so far."""
        path = self.log_dir / f"worker{index}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _check_worker(self, worker: int) -> None:
        whole_number("worker", worker, minimum=0, maximum=self.workers - 1,
                     hint=f"Workers are numbered 0 to {self.workers - 1}.")

    def wait_for(self, text: str, worker: int = 0, timeout: float = 120) -> str:
        """Wait until worker ``worker``'s log contains ``text``; return the log so far.

        Raises :class:`WorkerFailed` if any worker exits with an error first (stopping the
        others), and TimeoutError (stopping them too) if the text doesn't appear in time.
        """
        self._check_worker(worker)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log(worker):
                return self.log(worker)
            self._raise_if_failed()
            if self._codes()[worker] is not None and text not in self.log(worker):
                self.stop()
                raise WorkerFailed(f"worker {worker} finished without printing {text!r}; the others were stopped. "
                                   f"Logs are in {self.log_dir}.")
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"worker {worker} did not print {text!r} within {timeout:.0f} s; the workers were "
                           f"stopped. Logs are in {self.log_dir}.")

    def kill(self, worker: int) -> None:
        """Kill worker ``worker`` at once (SIGKILL), as a machine failure would; the others keep running."""
        self._check_worker(worker)
        pid = self.pids[worker]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return  # it had already exited
        if not self.isolated:
            self.processes[worker].wait(timeout=10)

    def wait_for_exit(self, worker: int, timeout: float = 120) -> int:
        """Wait until worker ``worker`` exits, by itself, and return its exit code (negative: killed by
        that signal, e.g. −9 for SIGKILL). The others keep running: after a failure this lets you
        watch how a survivor ends. TimeoutError (stopping every worker) if it doesn't in time."""
        self._check_worker(worker)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self._codes()[worker]
            if code is not None:
                return code
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"worker {worker} did not exit within {timeout:.0f} s; the workers were stopped. "
                           f"Logs are in {self.log_dir}.")

    @property
    def exit_codes(self) -> list[int | None]:
        """Each worker's exit code, or None while it runs."""
        return self._codes()

    def _raise_if_failed(self) -> None:
        for index, code in enumerate(self._codes()):
            if code not in (None, 0):
                self.stop()
                tail = "\n".join(self.log(index).splitlines()[-15:])
                raise WorkerFailed(f"worker {index} exited with code {code}; the others were stopped. "
                                   f"Its last lines:\n{tail}")

    def wait(self, timeout: float = 120) -> list[str]:
        """Wait for every worker to finish; return their logs. Raises on a failure or a timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._raise_if_failed()
            if all(code == 0 for code in self._codes()):
                return [self.log(i) for i in range(self.workers)]
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"the {self.workers} workers did not finish within {timeout:.0f} s and were stopped. "
                           f"Logs are in {self.log_dir}.")

    def stop(self) -> None:
        """Kill every worker that is still running (safe to call twice)."""
        if self.isolated:
            for pid in self._isolated_pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if self.launcher is not None and self.launcher.poll() is None:
                self.launcher.kill()  # its workers die with it (PR_SET_PDEATHSIG)
            if self.launcher is not None:
                try:
                    self.launcher.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            _wait_until_gone(self._isolated_pids())  # SIGKILL is delivered asynchronously
            return
        for process in self.processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    process.kill()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def _isolated_pids(self) -> list[int]:
        path = self.log_dir / "pids"
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    @property
    def pids(self) -> list[int]:
        """The workers' process ids."""
        return self._isolated_pids() if self.isolated else [p.pid for p in self.processes]
