"""The device-configuration names of older tutorials, and today's: which still work, which moved.

Lesson 00 prints the table from the installed TensorFlow, so it stays true as TensorFlow changes.
"""

from __future__ import annotations

from typing import Any

#: Device-configuration names in older tutorials (left) and their TensorFlow 2.16+ names.
API_RENAMES: tuple[tuple[str, str], ...] = (
    ("tf.config.experimental.list_physical_devices", "tf.config.list_physical_devices"),
    ("tf.config.experimental.list_logical_devices", "tf.config.list_logical_devices"),
    ("tf.config.experimental.set_virtual_device_configuration", "tf.config.set_logical_device_configuration"),
    ("tf.config.experimental.get_virtual_device_configuration", "tf.config.get_logical_device_configuration"),
    ("tf.config.experimental.VirtualDeviceConfiguration", "tf.config.LogicalDeviceConfiguration"),
    ("tf.config.experimental.set_visible_devices", "tf.config.set_visible_devices"),
    ("tf.config.experimental.set_memory_growth", "tf.config.experimental.set_memory_growth"),
)


def resolve_name(tf: Any, dotted: str) -> Any:
    """Look up a dotted name such as "tf.config.list_logical_devices"; None if it is gone."""
    obj: Any = tf
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def api_rename_table(tf: Any) -> list[tuple[str, str, str]]:
    """For each old name: today's name, and whether the old one still works here.

    Example:
        >>> api_rename_table(import_tensorflow())[0][2]  # doctest: +SKIP
        'alias of the new name'
    """
    rows = []
    for old, new in API_RENAMES:
        old_obj, new_obj = resolve_name(tf, old), resolve_name(tf, new)
        if new_obj is None:
            raise LookupError(f"{new} is missing from TensorFlow {tf.__version__}: update API_RENAMES.")
        if old == new:
            status = "unchanged (still experimental)"
        elif old_obj is None:
            status = "removed"
        elif old_obj is new_obj:
            status = "alias of the new name"
        else:
            status = "still there, deprecated"
        rows.append((old, new, status))
    return rows
