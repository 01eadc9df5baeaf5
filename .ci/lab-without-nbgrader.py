"""Keep nbgrader's menus and server extensions out of the JupyterLab that `make lab` opens.

nbgrader is in the main environment for tests/test_nbgrader.py. This writes what
`jupyter labextension disable --level=sys_prefix @jupyter/nbgrader` (which disables and locks it, so the
plugin manager can't turn it back on) and, for each of nbgrader's four server extensions,
`jupyter server extension disable --sys-prefix nbgrader.server_extensions.PART` write (the same files,
byte for byte), with the functions those commands call, in one process: the five commands took 10.8
CPU-seconds (14 s) at the start of every `make setup`, this one process about 1.6 to 4.
"""

from jupyter_server.extension.serverextension import toggle_server_extension_python
from jupyterlab.commands import AppOptions, disable_extension, lock_extension

options = AppOptions()
disable_extension("@jupyter/nbgrader", app_options=options, level="sys_prefix")
lock_extension("@jupyter/nbgrader", app_options=options, level="sys_prefix")
for part in ("formgrader", "validate_assignment", "assignment_list", "course_list"):
    toggle_server_extension_python(f"nbgrader.server_extensions.{part}", enabled=False, sys_prefix=True)
