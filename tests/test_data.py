"""The offline datasets: the shipped digits file is scikit-learn's, unchanged, and splits as documented."""

import hashlib

import numpy as np
import pytest

from mgpu_edu import data
from mgpu_edu._validate import BadArgument

DIGITS = data.DIGITS_PATH


def test_the_shipped_digits_file_is_byte_for_byte_the_one_scikit_learn_ships():
    # The hash of sklearn/datasets/data/digits.csv.gz (scikit-learn 1.x); README.md there says where it is from.
    assert hashlib.sha256(DIGITS.read_bytes()).hexdigest() == data.DIGITS_SHA256


def test_digits_has_the_uci_test_set_shape_and_class_counts():
    split = data.digits(test_fraction=0.5)
    x = np.concatenate([split.x_train, split.x_test])
    y = np.concatenate([split.y_train, split.y_test])
    assert x.shape == (1797, 64) and x.dtype == np.float32 and y.dtype == np.int32
    assert 0 <= x.min() and x.max() == 1.0  # counts 0-16, scaled by 1/16
    assert np.array_equal(np.unique(x * 16), np.arange(17))
    # The per-class counts the UCI description and scikit-learn's documentation give.
    assert np.bincount(y).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def test_digits_split_is_seeded_and_images_are_the_same_pixels():
    flat, again, images = data.digits(seed=3), data.digits(seed=3), data.digits(images=True, seed=3)
    assert flat.x_train.shape == (1438, 64) and flat.x_test.shape == (359, 64)
    np.testing.assert_array_equal(flat.x_train, again.x_train)
    np.testing.assert_array_equal(images.x_train.reshape(-1, 64), flat.x_train)
    assert not np.array_equal(data.digits(seed=4).y_train, flat.y_train)


@pytest.mark.parametrize("fraction", [0, 1, -0.1, 1.5, "0.2"])
def test_digits_refuses_a_test_fraction_outside_0_1_and_names_it(fraction):
    with pytest.raises(BadArgument, match=f"test_fraction={fraction!r}"):
        data.digits(test_fraction=fraction)


def test_skip_text_lines_walk_the_alphabet():
    split = data.skip_text(n=50, length=8, seed=1)
    assert split.x_train.shape == (40, 8) and split.x_test.shape == (10, 8) and split.x_train.dtype == np.int32
    np.testing.assert_array_equal(split.x_train[:, 1:], split.y_train[:, :-1])  # y is x moved on by one
    steps = (split.x_train[:, 1:] - split.x_train[:, :-1]) % 26
    assert ((steps == steps[:, :1]) & (steps >= 1) & (steps <= 3)).all()  # one step per line, 1 to 3
    assert data.letters([0, 1, 25]) == "abz"
    with pytest.raises(ValueError, match="length=1"):
        data.skip_text(length=1)


@pytest.mark.slow
def test_the_tiny_gpt_learns_skip_text():
    import keras

    from mgpu_edu import models

    split = data.skip_text(n=2048, length=16)
    model = models.tiny_gpt(vocab=26, seq_len=16, hidden=32, heads=4, layers=2, seed=0)
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(split.x_train, split.y_train, batch_size=64, epochs=6, verbose=0)  # 26 steps an epoch: 156
    predicted = np.argmax(model.predict(split.x_test, verbose=0), axis=-1)
    assert (predicted[:, 1:] == split.y_test[:, 1:]).mean() > 0.99  # from the second letter on: exact
    assert (predicted[:, 0] == split.y_test[:, 0]).mean() < 0.5  # the first letter alone can't give the step
