"""The small Keras models the lessons share. Built on whatever device scope is active."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mgpu_edu._validate import BadArgument
from mgpu_edu.runtime import quiet


def mlp(inputs: int = 64, classes: int = 10, hidden: Sequence[int] = (64,), seed: int = 0, l2: float = 0.0) -> Any:
    """A small classifier that outputs logits: Dense(ReLU) layers then Dense(classes).

    Same seed, same starting weights, so two copies can be compared step by step.
    ``l2`` > 0 puts an L2 regularizer of that factor on every kernel: its penalties appear in
    ``model.losses``. Runs on logical CPUs as well as GPUs.

    Example:
        >>> model = mlp(64, 10, hidden=(32,))  # doctest: +SKIP
        >>> model.count_params()  # doctest: +SKIP
        2410
    """
    quiet.import_tensorflow()
    import keras

    if not (isinstance(l2, (int, float)) and not isinstance(l2, bool) and l2 >= 0):
        raise BadArgument(f"l2={l2!r}: give the L2 factor as a number, 0 or more (e.g. l2=1e-3), or 0 for none.")
    keras.utils.set_random_seed(seed)
    regularizer = {"kernel_regularizer": keras.regularizers.L2(l2)} if l2 else {}
    layers = [keras.Input((inputs,))]
    layers += [keras.layers.Dense(width, activation="relu", name=f"hidden{i}", **regularizer)
               for i, width in enumerate(hidden)]
    layers.append(keras.layers.Dense(classes, name="logits", **regularizer))
    return keras.Sequential(layers, name="mlp")


def per_example_loss() -> Any:
    """Sparse categorical cross-entropy on logits, one loss per example (``reduction=None``)."""
    quiet.import_tensorflow()
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def small_cnn(input_shape: Sequence[int] = (8, 8, 1), classes: int = 10, seed: int = 0) -> Any:
    """The MirroredStrategy tutorial article's small CNN (Conv2D 32 → max-pool → Dense 64 → classes), with logits out.

    For 8×8 digits the convolution pads ("same") so the image survives the pooling.
    """
    quiet.import_tensorflow()
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input(tuple(input_shape)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(classes, name="logits"),
    ], name="small_cnn")


def text_cnn(vocab: int = 1000, length: int = 100, classes: int = 8, seed: int = 0,
             softmax_output: bool = False) -> Any:
    """A Conv1D text classifier: Embedding → Conv1D 64 → pool → Conv1D 32 → pool → Dense.

    The model of "Eat TensorFlow2 in 30 Days", chapter 6-4 ("Model Training Using Multiple GPUs").
    It outputs logits, to pair with ``from_logits=True``. ``softmax_output=True`` rebuilds the
    chapter's bug (softmax output *and* ``from_logits=True``) so the lesson can show its effect.
    """
    quiet.import_tensorflow()
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((length,), dtype="int32"),
        keras.layers.Embedding(vocab, 8),
        keras.layers.Conv1D(64, 5, activation="relu"),
        keras.layers.MaxPooling1D(2),
        keras.layers.Conv1D(32, 3, activation="relu"),
        keras.layers.MaxPooling1D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(classes, activation="softmax" if softmax_output else None, name="output"),
    ], name="text_cnn")


def tiny_gpt(vocab: int = 32, seq_len: int = 16, hidden: int = 32, heads: int = 4, layers: int = 2,
             seed: int = 0) -> Any:
    """A tiny decoder-only transformer (:class:`mgpu_edu.gpt.TinyGPT`): token ids [b, s] in, next-token logits out.

    Blocks of LayerNorm, causal multi-head attention and a GELU MLP (4 × hidden), pre-norm, no
    dropout; same seed, same weights. Small enough for a CPU: the defaults hold 27,840 weights.
    Runs on logical CPUs as well as GPUs.

    Example:
        >>> model = tiny_gpt()  # doctest: +SKIP
        >>> model(tf.zeros([2, 16], tf.int32)).shape  # doctest: +SKIP
        TensorShape([2, 16, 32])
    """
    from mgpu_edu._validate import whole_number

    for name, value in (("vocab", vocab), ("seq_len", seq_len), ("hidden", hidden), ("heads", heads),
                        ("layers", layers)):
        whole_number(name, value, minimum=1, maximum=4096, where="tiny_gpt")
    if hidden % heads:
        raise BadArgument(f"tiny_gpt: hidden={hidden} must divide into heads={heads} heads of equal width; pick "
                          f"heads among {[h for h in range(1, hidden + 1) if hidden % h == 0]}.")
    quiet.import_tensorflow()
    import keras

    from mgpu_edu.workloads.gpt import TinyGPT

    keras.utils.set_random_seed(seed)
    return TinyGPT(vocab, seq_len, hidden, heads, layers, name="tiny_gpt")
