"""mgpu_edu: the tested helpers behind the multi-GPU lessons.

``import mgpu_edu`` is instant: TensorFlow is imported only by the functions that need it.

Example:
    >>> import mgpu_edu
    >>> layout = mgpu_edu.setup_devices(4)  # doctest: +SKIP
    Local · No GPU → 4 logical CPUs: same code paths, no real speed-up
"""

from mgpu_edu.devices import DeviceLayout, DeviceSetupError, logical_devices, setup_devices
from mgpu_edu.env import Environment, detect_environment
from mgpu_edu.quiet import import_tensorflow
from mgpu_edu.source import show_source

__version__ = "0.1.0"

__all__ = [
    "DeviceLayout",
    "DeviceSetupError",
    "Environment",
    "__version__",
    "detect_environment",
    "import_tensorflow",
    "logical_devices",
    "setup_devices",
    "show_source",
]
