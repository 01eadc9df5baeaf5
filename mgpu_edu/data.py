"""Offline datasets for the lessons: shipped with a package or generated, never downloaded.

Every function here works with no network and no GPU. Real datasets that a lesson could
download on Colab are an option in that lesson, never the default.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Split(NamedTuple):
    """Train and test arrays."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def digits(images: bool = False, test_fraction: float = 0.2, seed: int = 0) -> Split:
    """scikit-learn's 1,797 handwritten 8×8 digits (shipped with scikit-learn, no download).

    Pixels scaled to [0, 1] as float32; labels 0–9 as int32. ``images=True`` gives shape
    (n, 8, 8, 1) for convolutions, otherwise (n, 64).

    Example:
        >>> split = digits()
        >>> split.x_train.shape, split.x_test.shape
        ((1438, 64), (359, 64))
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError("digits() needs scikit-learn, which ships the data: pip install scikit-learn") from error
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction={test_fraction!r} must be between 0 and 1, e.g. 0.2.")
    bunch = load_digits()
    x = (bunch.data / 16.0).astype("float32")
    y = bunch.target.astype("int32")
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    if images:
        x = x.reshape(-1, 8, 8, 1)
    cut = len(x) - int(round(len(x) * test_fraction))
    return Split(x[:cut], y[:cut], x[cut:], y[cut:])
