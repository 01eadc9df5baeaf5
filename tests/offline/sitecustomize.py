"""Network guard for every Python process of a test run: only this machine may be reached.

The root ``conftest.py`` puts this folder on ``PYTHONPATH``, so Python runs it at start-up in
pytest itself, in every lesson kernel nbval starts, and in every worker process a lesson or a
test starts. A connection or name lookup for anything but this machine raises OSError and is
written to the file named by ``MGPU_EDU_NETWORK_LOG``; the test session fails if that file
gains a line. That proves the lessons never download anything, even when they catch the error.

Python imports only the first ``sitecustomize`` on ``sys.path``, so this one would hide any other (a
system's, or one a run puts on ``PYTHONPATH`` to adjust every process): at start-up it runs the next one
on the path too, as Python would have without it.
"""

import ipaddress
import os
import socket
import sys

GUARD = "mgpu_edu offline guard"
_HERE = {"localhost", "ip6-localhost", "ip6-loopback", "", socket.gethostname()}


def _is_local(host) -> bool:
    if host is None:
        return True
    host = host.decode() if isinstance(host, bytes) else str(host)
    if host in _HERE or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _refuse(what: str) -> None:
    log_file = os.environ.get("MGPU_EDU_NETWORK_LOG")
    if log_file:
        with open(log_file, "a", encoding="utf-8") as log:
            log.write(f"{os.getpid()}\t{' '.join(sys.argv)[:300]}\t{what}\n")
    raise OSError(f"{GUARD}: network access to {what!r} blocked. Lessons and tests must work offline: "
                  "use data a package ships (sklearn.datasets.load_digits) or generate it.")


_getaddrinfo = socket.getaddrinfo


def _guarded_getaddrinfo(host, *args, **kwargs):
    if not _is_local(host):
        _refuse(str(host))
    return _getaddrinfo(host, *args, **kwargs)


def _guard_connect(method):
    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(address[0]):
            _refuse(f"{address[0]}:{address[1]}")
        return method(self, address)

    return connect


socket.getaddrinfo = _guarded_getaddrinfo
socket.socket.connect = _guard_connect(socket.socket.connect)
socket.socket.connect_ex = _guard_connect(socket.socket.connect_ex)


def _run_the_sitecustomize_this_one_hides() -> None:
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        folder = os.path.abspath(entry or os.getcwd())
        candidate = os.path.join(folder, "sitecustomize.py")
        if folder != here and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_sitecustomize_after_the_offline_guard", candidate)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


if __name__ == "sitecustomize":  # Python's start-up, not conftest.py guarding pytest itself
    _run_the_sitecustomize_this_one_hides()
