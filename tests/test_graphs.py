"""graphs: what TensorFlow's traced graph keeps for the backward pass, and moves between devices."""

from __future__ import annotations

import pytest

from mgpu_edu import graphs, quiet

tf = quiet.import_tensorflow()
pytestmark = pytest.mark.usefixtures("four_devices")  # the process's device layout, before any TensorFlow runs


def test_kept_for_backward_reads_tensorflows_graph():
    w = tf.Variable(tf.ones([4, 3]))

    def forward(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.relu(x @ w))
        return tape, loss

    kept = graphs.kept_for_backward(forward, lambda r: r[0].gradient(r[1], w), tf.ones([8, 4]))
    # x (an input) is what w's gradient reads, and is no activation; ReLU's gradient reads its output
    assert [(k.op, k.shape, k.nbytes, k.read_by) for k in kept] == [("Relu", (8, 3), 96, ("ReluGrad",))]


def test_gradients_nobody_asked_for_keep_nothing():
    """TensorFlow's gradient of x / c also builds the gradient for the constant c, reading x; it is dropped, so x
    is not kept. The same division as a product by 1/c reads nothing."""
    w = tf.Variable(tf.ones([4, 3]))

    def forward(x, divide):
        with tf.GradientTape() as tape:
            y = x @ w
            scaled = y / 2.0 if divide else y * 0.5
            loss = tf.reduce_sum(tf.exp(scaled))
        return tape, loss

    for divide in (True, False):
        kept = graphs.kept_for_backward(lambda x, divide=divide: forward(x, divide),
                                        lambda r: r[0].gradient(r[1], w), tf.ones([8, 4]))
        assert [k.op for k in kept] == ["Exp"]


def test_scopes_drop_the_suffix_of_a_scope_entered_again():
    kept = graphs.Kept("block0/split_1/Gelu/mul:0", "Mul", "CPU:0", (2,), 8, ("Mul",))
    assert kept.scopes() == ["block0", "split", "Gelu"] and kept.scope(1) == "split" and kept.scope(5) == ""


def test_bytes_between_devices_sees_outputs_variables_and_captured_tensors(four_devices):
    with tf.device(four_devices[0]):
        v = tf.Variable(tf.ones([1000]))
        c = tf.ones([1000]) * 2.0

    def reads_elsewhere(x):
        with tf.device(four_devices[0]):
            y = x * 2.0
        with tf.device(four_devices[1]):
            return tf.reduce_sum(v * x) + tf.reduce_sum(c) + tf.reduce_sum(y)

    assert graphs.bytes_between_devices(reads_elsewhere, tf.ones([1000])) == {"CPU:1": 3 * 4000}

    def reads_at_home(x):
        with tf.device(four_devices[0]):
            return tf.reduce_sum(v * x) + tf.reduce_sum(c)

    assert graphs.bytes_between_devices(reads_at_home, tf.ones([1000])) == {}


def test_an_eager_tape_keeps_what_a_traced_step_drops():
    """Lesson 13 §3: run eagerly, the tape keeps every tensor a recorded op's gradient function may read: here the
    input of a division by a constant, which the traced step above does not keep."""
    import gc
    import weakref

    w = tf.Variable(tf.ones([4, 3]))
    with tf.GradientTape() as tape:
        y = tf.ones([8, 4]) @ w
        loss = tf.reduce_sum(tf.exp(y / 2.0))
    held = weakref.ref(y)
    del y
    gc.collect()
    assert held() is not None  # kept by the tape, for the division's gradient
    tape.gradient(loss, w)
    del tape
    gc.collect()
    assert held() is None


def test_a_tapes_gradient_ops_name_no_device(four_devices):
    """Lesson 14 §2: the forward ops run where their tf.device scopes say; the gradient ops a GradientTape adds
    name no device, so TensorFlow places them itself (its default device, run eagerly)."""
    def forward(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            parts = []
            for d, device in enumerate(four_devices[:2]):
                with tf.device(device):
                    parts.append(tf.reduce_sum(tf.exp(x * float(d + 1))))
            loss = parts[0] + parts[1]
        return tape, loss, x

    where = graphs.op_devices(forward, lambda r: r[0].gradient(r[1], r[2]), tf.ones([5]))
    assert {"CPU:0", "CPU:1"} <= set(where["forward"])
    assert set(where["backward"]) == {""}
