"""pytest set-up shared by the unit tests and nbval's lesson runs."""

import os

# The banner says where it runs; CI and nbval runs count as a local machine.
os.environ.setdefault("MGPU_EDU_PLATFORM", "local")


def pytest_collectstart(collector):
    """Don't compare stderr in lessons: TensorFlow writes different start-up lines there
    under nbval than in JupyterLab. stdout and rich outputs of checked cells still count."""
    if hasattr(collector, "skip_compare"):  # nbval's notebook collector
        collector.skip_compare = (*collector.skip_compare, "stderr")
