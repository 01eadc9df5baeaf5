"""The small Keras models the lessons share. Built on whatever device scope is active."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mgpu_edu import quiet


def mlp(inputs: int = 64, classes: int = 10, hidden: Sequence[int] = (64,), seed: int = 0) -> Any:
    """A small classifier that outputs logits: Dense(ReLU) layers then Dense(classes).

    Same seed, same starting weights, so two copies can be compared step by step.
    Runs on logical CPUs as well as GPUs.

    Example:
        >>> model = mlp(64, 10, hidden=(32,))  # doctest: +SKIP
        >>> model.count_params()  # doctest: +SKIP
        2410
    """
    quiet.import_tensorflow()
    import keras

    keras.utils.set_random_seed(seed)
    layers = [keras.Input((inputs,))]
    layers += [keras.layers.Dense(width, activation="relu", name=f"hidden{i}") for i, width in enumerate(hidden)]
    layers.append(keras.layers.Dense(classes, name="logits"))
    return keras.Sequential(layers, name="mlp")


def per_example_loss() -> Any:
    """Sparse categorical cross-entropy on logits, one loss per example (``reduction=None``)."""
    quiet.import_tensorflow()
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
