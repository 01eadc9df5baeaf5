"""Offline datasets for the lessons: shipped with a package or generated, never downloaded.

Every function here works with no network and no GPU. Real datasets that a lesson could
download on Colab are an option in that lesson, never the default.
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from mgpu_edu._validate import BadArgument, whole_number
from mgpu_edu.runtime import quiet


class Split(NamedTuple):
    """Train and test arrays."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


# The UCI handwritten digits, byte for byte the copy scikit-learn ships
# (sklearn/datasets/data/digits.csv.gz): 1,797 rows of 64 pixel counts (0-16) and the label.
# Shipped here so the lessons need no scikit-learn: importing it (TensorFlow's Keras imports it
# whenever it is installed) costs every TensorFlow process about 1.8 s and 57 MB. Its provenance
# and licence: mgpu_edu/workloads/datasets/README.md.
DIGITS_PATH = Path(__file__).with_name("datasets") / "digits.csv.gz"
DIGITS_SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"


@functools.cache
def _digits_table() -> np.ndarray:
    """The shipped file as integers, parsed once per process (callers derive new arrays from it)."""
    with gzip.open(DIGITS_PATH) as stream:
        table = np.loadtxt(stream, delimiter=",", dtype=np.int64)
    table.flags.writeable = False
    return table


def digits(images: bool = False, test_fraction: float = 0.2, seed: int = 0) -> Split:
    """The 1,797 handwritten 8×8 digits of the UCI dataset (shipped with mgpu_edu, no download).

    The same file scikit-learn's ``load_digits`` reads. Pixels scaled to [0, 1] as float32;
    labels 0–9 as int32, shuffled with ``seed``, the last ``test_fraction`` held out for testing.
    ``images=True`` gives shape (n, 8, 8, 1) for convolutions, otherwise (n, 64).

    Example:
        >>> split = digits()
        >>> split.x_train.shape, split.x_test.shape
        ((1438, 64), (359, 64))
    """
    if not isinstance(test_fraction, (int, float)) or not 0 < test_fraction < 1:
        raise BadArgument(f"test_fraction={test_fraction!r} must be between 0 and 1, e.g. 0.2.")
    table = _digits_table()
    x = (table[:, :-1] / 16.0).astype("float32")
    y = table[:, -1].astype("int32")
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    if images:
        x = x.reshape(-1, 8, 8, 1)
    cut = len(x) - int(round(len(x) * test_fraction))
    return Split(x[:cut], y[:cut], x[cut:], y[cut:])


def topic_sequences(n: int = 2000, classes: int = 8, vocab: int = 1000, length: int = 100,
                    test_fraction: float = 0.2, seed: int = 0) -> Split:
    """Generated "newswire" token sequences: an offline stand-in for the Reuters topics dataset.

    Each class has 20 keywords. A sequence is ``length`` token ids (1 … vocab−1; 0 is padding),
    mostly common words drawn from the whole vocabulary, with about 30 % of its tokens taken
    from its class's keywords. A Conv1D model learns to spot them, as it would spot topic words
    in news. Labels are int32 in 0 … classes−1.

    Example:
        >>> split = topic_sequences(n=100, classes=4)
        >>> split.x_train.shape, int(split.y_train.max()) < 4
        ((80, 100), True)
    """
    for name, value, low in (("n", n, 2), ("classes", classes, 2), ("vocab", vocab, 20 * classes + 1),
                             ("length", length, 5)):
        whole_number(name, value, minimum=low)
    rng = np.random.default_rng(seed)
    keywords = rng.choice(np.arange(1, vocab), size=(classes, 20), replace=False)
    y = rng.integers(0, classes, n).astype("int32")
    x = rng.integers(1, vocab, size=(n, length))
    topical = rng.random((n, length)) < 0.3
    x[topical] = keywords[y[:, None].repeat(length, 1)[topical], rng.integers(0, 20, topical.sum())]
    cut = n - int(round(n * test_fraction))
    return Split(x[:cut].astype("int32"), y[:cut], x[cut:].astype("int32"), y[cut:])


ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def skip_text(n: int = 1024, length: int = 16, test_fraction: float = 0.2, seed: int = 0) -> Split:
    """Generated text for the tiny GPT: lines that walk the alphabet in fixed steps, as token ids 0 … 25.

    Each line starts at a random letter and moves a random 1 to 3 letters at a time, wrapping from
    z to a ("adgjm…" is a step of 3). Two letters give the step away, so from its second letter on
    a model can predict every next letter exactly (the first only one time in three): a next-token
    task that :func:`mgpu_edu.models.tiny_gpt` learns in about 150 steps on a CPU (tests/test_data.py).
    ``x`` holds the first ``length`` letters of each line and ``y`` the same line moved one letter on
    (the next token at every position). :func:`letters` turns ids back into text.

    Example:
        >>> split = skip_text(n=10, length=6)
        >>> letters(split.x_train[0]), letters(split.y_train[0])
        ('wyaceg', 'yacegi')
    """
    for name, value, low in (("n", n, 2), ("length", length, 2)):
        whole_number(name, value, minimum=low, where="skip_text")
    rng = np.random.default_rng(seed)
    starts, steps = rng.integers(0, 26, (n, 1)), rng.integers(1, 4, (n, 1))
    line = ((starts + steps * np.arange(length + 1)) % 26).astype("int32")
    x, y = line[:, :-1], line[:, 1:]
    cut = n - int(round(n * test_fraction))
    return Split(x[:cut], y[:cut], x[cut:], y[cut:])


def letters(ids: Any) -> str:
    """Token ids (0 … 25) as the letters they stand for: 0 is a, 25 is z."""
    return "".join(ALPHABET[int(i)] for i in np.asarray(ids).reshape(-1))


def reuters(num_words: int = 10_000, length: int = 300) -> Split:
    """The real Reuters newswire topics (46 classes), as "Eat TensorFlow2 in 30 Days" used them. **Downloads** ~2 MB.

    Only for machines with internet (Colab); the lessons default to :func:`topic_sequences`.
    """
    quiet.import_tensorflow()
    import keras

    (x_train, y_train), (x_test, y_test) = keras.datasets.reuters.load_data(num_words=num_words)
    pad = keras.utils.pad_sequences
    return Split(pad(x_train, maxlen=length).astype("int32"), y_train.astype("int32"),
                 pad(x_test, maxlen=length).astype("int32"), y_test.astype("int32"))


def mnist() -> Split:
    """The real MNIST digits (28×28×1, [0, 1]), as the MirroredStrategy tutorial used them. **Downloads** ~11 MB.

    Only for machines with internet (Colab); the lessons default to :func:`digits`.
    """
    quiet.import_tensorflow()
    import keras

    (x_train, y_train), (x_test, y_test) = keras.datasets.mnist.load_data()
    scale = np.float32(1 / 255)
    return Split((x_train[..., None] * scale).astype("float32"), y_train.astype("int32"),
                 (x_test[..., None] * scale).astype("float32"), y_test.astype("int32"))
