"""Build hook: ship the lessons, their manifest and the worker scripts inside the wheel, and nothing else.

They go in as ``mgpu_edu/lessons/*.ipynb``, ``mgpu_edu/lessons/course.toml`` and
``mgpu_edu/examples/*.py`` for pip-installed users (``mgpu-edu lessons DIR`` copies them out).
Listing files, not folders, keeps out what runs and editors leave there (``lessons/_scratch``,
``.ipynb_checkpoints``). Editable installs skip this: ``mgpu_edu.course.shipped_folder`` finds
the folders beside the package instead.
"""

from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SHIPPED = {"lessons": ("*.ipynb", "course.toml"), "examples": ("*.py",)}


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version, build_data):
        if self.target_name != "wheel" or version == "editable":
            return
        for folder, patterns in SHIPPED.items():
            for pattern in patterns:
                for path in sorted((Path(self.root) / folder).glob(pattern)):
                    build_data["force_include"][str(path)] = f"mgpu_edu/{folder}/{path.name}"
