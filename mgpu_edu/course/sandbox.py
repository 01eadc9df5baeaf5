"""Start a student's kernel apart from the grader, the other submissions and the network, as far as the OS allows.

``mgpu-edu grade`` starts every kernel through this launcher::

    python -m mgpu_edu.course.sandbox ROOT --memory-mb 3000 -- python -m ipykernel_launcher -f ROOT/kernel.json

The launcher stays the kernel's parent, and the parent of everything the kernel starts (it is a *child
subreaper*, so even a process that detaches itself stays below it), and when the kernel exits it kills
whatever is left. Before it starts the kernel it takes away, on Linux, what it can:

- **files**: with Landlock (Linux 5.13 and later), the kernel and its children may write and delete only
  under ``ROOT`` (a throwaway folder of the submission's own) and a few devices (``/dev/null``, the
  GPUs), and read only the system's folders, Python's own, this package's and ``ROOT``: not the
  instructor's home, ``/tmp`` (where the other submissions' folders are), the grade files, the
  terminals (``/dev/pts``) or the shared memory other processes use (``/dev/shm``);
- **other processes**: under Landlock they can't trace the grader or, from Linux 6.12, signal it;
- **the network**: in a network namespace of their own (unprivileged user namespaces), only loopback;
- **size**: no core dumps, no file over 1 GiB, and where no GPU is present a data limit of twice the
  memory limit (the grader's watchdog enforces the memory limit itself, on the whole process tree).

Whatever is unavailable is skipped, and :func:`describe` says what holds here. These are defences in
depth for one user's machine, not a container: a kernel can still use what that user's account reaches
without files or the network (for example a desktop session's D-Bus). For classes you don't trust, grade
inside a container (docs/instructors.md, "Grading untrusted notebooks").
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)  # execute, write, read, truncate, ioctl
_READ = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read file, read directory
#: Top-level folders a kernel may read: the system's (the home folders, /tmp, /mnt, /media and /srv are not).
SYSTEM_FOLDERS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/opt", "/proc",
                  "/sys", "/nix", "/gnu", "/snap", "/var/lib", "/var/cache", "/run")
#: The devices a kernel may open (the GPUs' too, ``/dev/nvidia*`` and ``/dev/dri``): no terminal, no /dev/shm.
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@functools.cache
def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers (0 where there is none, or off Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        version = _libc().syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except (OSError, AttributeError):
        return 0
    return max(0, int(version))


def readable_folders(root: Path) -> list[str]:
    """What a sandboxed kernel may read: the system's folders, Python's and this package's, and root."""

    paths = {*SYSTEM_FOLDERS, sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(sys.executable).resolve().parent),
             *sysconfig.get_paths().values(), package_folder(), str(root)}
    here = os.getcwd()
    paths |= {p for p in sys.path if p and os.path.isabs(p) and p != here}
    paths |= {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isabs(p)}
    return sorted(p for p in paths if os.path.exists(p))


def package_folder() -> str:
    """The folder a kernel reads mgpu_edu from: site-packages, or, for an editable install, the whole clone."""
    import mgpu_edu

    return str(Path(mgpu_edu.__file__).resolve().parents[1])


def _landlock(root: Path) -> bool:
    """Restrict this process (and every child) to reading the readable folders and writing only under root."""
    abi = landlock_abi()
    if abi < 1:
        return False
    handled = (1 << 13) - 1 | ((1 << 13) if abi >= 2 else 0) | ((1 << 14) if abi >= 3 else 0) | \
        ((1 << 15) if abi >= 5 else 0)

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    attr = RulesetAttr(handled, 0, 0b11 if abi >= 6 else 0)  # scoped: abstract unix sockets and signals
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    libc = _libc()
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return False
    rules = [(p, _READ) for p in readable_folders(root)]
    rules += [(p, handled) for p in DEVICES] + [(str(root), handled)]
    rules += [(str(p), handled) for p in Path("/dev").glob("nvidia*")] + [(p, handled) for p in ("/dev/dri",)]
    try:
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                allowed = rights & handled if os.path.isdir(path) else rights & handled & _FILE_RIGHTS
                rule = PathBeneath(allowed, fd)
                libc.syscall(_SYS_ADD_RULE, ruleset, ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0))
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False
        return libc.syscall(_SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) == 0
    finally:
        os.close(ruleset)


def _own_network() -> bool:
    """Move this process into a user and network namespace of its own (loopback only); False where that fails."""
    if not sys.platform.startswith("linux"):
        return False
    uid, gid = os.getuid(), os.getgid()
    if _libc().unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        return False
    try:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
        from mgpu_edu.runtime.cluster import loopback_up

        loopback_up()
    except OSError:
        return False
    return True


def _limits(memory_mb: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (2**30, 2**30))
    if memory_mb and not any(Path("/dev").glob("nvidia*")):  # CUDA maps far more than it uses: leave GPUs alone
        data = 2 * memory_mb * 2**20
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard == resource.RLIM_INFINITY or hard > data:
            resource.setrlimit(resource.RLIMIT_DATA, (data, data))


def describe() -> str:
    """One line: what the sandbox can take away on this machine."""
    if not sys.platform.startswith("linux"):
        return (f"{sys.platform}: each notebook in a folder and process tree of its own, with time and memory "
                "limits; files and network not restricted (grade untrusted classes in a container)")
    abi = landlock_abi()
    files = (f"files restricted by Landlock (ABI {abi}{', signals scoped' if abi >= 6 else ''})" if abi
             else "files not restricted (no Landlock in this kernel)")
    try:
        network = subprocess.run([sys.executable, "-c", "from mgpu_edu.course import sandbox; "
                                  "raise SystemExit(0 if sandbox._own_network() else 1)"],
                                 capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        network = False
    return f"Linux: {files}; network {'off (a namespace of its own)' if network else 'on (no user namespaces)'}"


def process_tree(pid: int | None, spare_root: bool = False) -> list[Any]:
    """Process pid and every process below it (psutil's), or, with spare_root, only those below; [] if it's gone."""
    import psutil

    if pid is None:
        return []
    try:
        root = psutil.Process(pid)
        return ([] if spare_root else [root]) + root.children(recursive=True)
    except psutil.Error:
        return []


def kill_tree(pid: int | None, spare_root: bool = False) -> None:
    """Kill process pid and everything below it (a subreaper keeps even detached processes there), or, with
    spare_root, only what is below it; again until none is left, a process may start another as it dies."""
    import psutil

    for _ in range(50):
        processes = process_tree(pid, spare_root)
        if not processes:
            return
        for process in processes:
            try:
                process.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(processes, timeout=1)


def main(argv: list[str] | None = None) -> int:
    """``python -m mgpu_edu.course.sandbox ROOT [--memory-mb MB] [--network] -- COMMAND...``: run COMMAND apart.

    Returns COMMAND's exit status, once it and everything it started have ended.
    """
    parser = argparse.ArgumentParser(prog="python -m mgpu_edu.course.sandbox")
    parser.add_argument("root", help="the only folder the kernel may write to")
    parser.add_argument("--memory-mb", type=int, default=0)
    parser.add_argument("--network", action="store_true", help="keep the network")
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        parser.error("give the command to run after --")
    split = argv.index("--")
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    root = Path(args.root).resolve()
    if sys.platform.startswith("linux"):
        _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if not args.network:
            _own_network()
        _landlock(root)
    if hasattr(os, "getuid"):
        _limits(args.memory_mb)
    # An interrupt is for the kernel, in the same process group. (A handler, not SIG_IGN, which the kernel
    # would inherit.)
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    kernel = subprocess.Popen(command, cwd=root)

    def stop(signum: int, frame: object) -> None:
        kernel.kill()

    signal.signal(signal.SIGTERM, stop)
    code = kernel.wait()
    kill_tree(os.getpid(), spare_root=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
