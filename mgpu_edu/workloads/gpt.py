"""A tiny decoder-only transformer (GPT) in Keras 3, and the math of its block as plain functions.

The block is pre-LayerNorm: ``x + attention(LN(x))``, then ``x + MLP(LN(x))``, with causal
multi-head attention and a GELU MLP of 4 × hidden. Activations inside the blocks are laid out
``[sequence, batch, hidden]``, as Megatron-LM lays them out, so that sequence parallelism can cut
them along the first axis. The functions (:func:`layer_norm`, :func:`causal_attention` and its core
:func:`attention`, :func:`block`) are what :class:`TinyGPT` runs and what :mod:`mgpu_edu.tensor` runs on shards of
the same weights, so a split model can be checked against this one exactly. No dropout: a split
model must give the same numbers. Runs on logical CPUs as well as GPUs.

Importing this module imports TensorFlow and Keras; ``models.tiny_gpt`` builds the model.
"""

from __future__ import annotations

import math
from typing import Any

from mgpu_edu.runtime import quiet

tf = quiet.import_tensorflow()  # TensorFlow first, with its start-up logs kept quiet

import keras  # noqa: E402  (after TensorFlow, so that Keras finds its backend quietly)

BLOCK_WEIGHTS = ("ln1_gamma", "ln1_beta", "wq", "wk", "wv", "wo", "bo",
                 "ln2_gamma", "ln2_beta", "w1", "b1", "w2", "b2")


def layer_norm(x: Any, gamma: Any, beta: Any, epsilon: float = 1e-5) -> Any:
    """LayerNorm over the last axis: each position's hidden vector to mean 0 and variance 1, then scaled and shifted."""
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + epsilon) * gamma + beta


def dense(x: Any, w: Any) -> Any:
    """``x`` ([s, b, in]) times ``w`` ([in, out]) → [s, b, out], written as one einsum.

    The same numbers as ``tf.matmul(x, w)``, but one contraction over positions and batch together:
    ``tf.matmul`` of a 3-D ``x`` is a matmul batched over positions, whose gradient for ``w`` is formed
    per position and then summed, and DTensor all-reduces those per-position products (lesson 15). Inside
    :func:`split_backward`, its backward pass computes only the input's gradient, and leaves the weight's.
    """
    if _DEFERRED:
        return _deferring_dense(x, w, _DEFERRED[-1])
    return tf.einsum("sbi,io->sbo", x, w)


_DEFERRED: list[list[tuple[Any, Any, Any]]] = []  # split_backward's stores: (weight, input, output gradient)


def _deferring_dense(x: Any, w: Any, store: list[tuple[Any, Any, Any]]) -> Any:
    @tf.custom_gradient
    def product(x: Any, w: Any) -> Any:
        def grad(upstream: Any) -> tuple[Any, Any]:
            store.append((w, x, upstream))  # what the weight's gradient needs, kept for the W pass
            return tf.einsum("sbo,io->sbi", upstream, w), tf.zeros_like(w)
        return tf.einsum("sbi,io->sbo", x, w), grad
    return product(x, w)


def split_backward(weights: dict[str, Any], tokens: Any, targets: Any, heads: int) -> tuple[dict, dict]:
    """TinyGPT's gradients as a zero-bubble pipeline computes them (Qi et al., 2024): a "B" pass, then a "W" pass.

    The B pass runs the backward pass for every input gradient, the one the previous stage would wait for,
    and for the weights that need no matrix product (LayerNorms, biases, embeddings); each weight matrix's
    product, xᵀ·(output gradient), is left out, its two factors kept. The W pass computes those products
    afterwards. Returns ``(b_pass, w_pass)``: gradients by name (``TinyGPT.weights_by_name``), the B pass's
    with zeros for the matrices; the two add up to the whole backward pass's gradients.

    Example:
        >>> b_pass, w_pass = split_backward(model.weights_by_name(), tokens, targets, heads=4)  # doctest: +SKIP
    """
    store: list[tuple[Any, Any, Any]] = []
    names = list(weights)
    _DEFERRED.append(store)
    try:
        with tf.GradientTape() as tape:
            tape.watch([weights[name] for name in names])
            loss = next_token_loss(forward(weights, tokens, heads), targets)
        b_pass = dict(zip(names, tape.gradient(loss, [weights[name] for name in names]), strict=True))
    finally:
        _DEFERRED.pop()
    by_tensor = {id(weights[name]): name for name in names}
    w_pass: dict[str, Any] = {}
    for w, x, upstream in store:  # the W pass: each matrix's product, from the factors the B pass kept
        name = by_tensor[id(w)]
        product = tf.einsum("sbi,sbo->io", x, upstream)
        w_pass[name] = w_pass[name] + product if name in w_pass else product
    return b_pass, w_pass


def causal_attention(x: Any, wq: Any, wk: Any, wv: Any, heads: int, recompute: bool = False) -> Any:
    """Causal multi-head attention of ``x`` ([s, b, hidden]) before its output projection: [s, b, heads·d_head].

    ``wq``, ``wk`` and ``wv`` are [hidden, heads·d_head], their columns grouped head by head, so
    the first d_head columns are head 0's: a device that holds some heads' columns runs exactly
    those heads. Position i attends to positions 0…i. With ``recompute``, the attention core
    (:func:`attention`: the scores, their softmax and its product with v) keeps only q, k and v for the
    backward pass, and runs again there (``tf.recompute_grad``): selective recomputation.
    """
    s, b = tf.shape(x)[0], tf.shape(x)[1]
    width = wq.shape[-1]
    d_head = width // heads

    def split(w: Any) -> Any:  # [s, b, heads·d] → [b, heads, s, d]
        return tf.transpose(tf.reshape(dense(x, w), [s, b, heads, d_head]), [1, 2, 0, 3])

    core = tf.recompute_grad(attention) if recompute else attention
    out = core(split(wq), split(wk), split(wv))  # [b, heads, s, d]
    return tf.reshape(tf.transpose(out, [2, 0, 1, 3]), [s, b, width])


def attention(q: Any, k: Any, v: Any, causal: bool = True) -> Any:
    """softmax(q·kᵀ/√d + mask)·v on one device, for q, k, v of shape [batch, heads, sequence, d]: with
    ``causal``, position i attends to positions j ≤ i only."""
    scores = tf.matmul(q, k, transpose_b=True) / math.sqrt(int(q.shape[-1]))
    if causal:
        s = tf.shape(q)[-2]
        ones = tf.ones([s, s], scores.dtype)
        scores += (tf.linalg.band_part(ones, 0, -1) - tf.linalg.band_part(ones, 0, 0)) * -1e9  # i sees j ≤ i only
    return tf.matmul(tf.nn.softmax(scores, axis=-1), v)


def mlp(x: Any, w1: Any, b1: Any, w2: Any) -> Any:
    """The block's MLP before its output bias: GELU(x·w1 + b1)·w2."""
    return dense(tf.nn.gelu(dense(x, w1) + b1), w2)


RECOMPUTE = ("none", "selective", "full")  #: what a block recomputes in the backward pass (see :func:`block`)


def block(x: Any, w: dict[str, Any], heads: int, recompute: str = "none") -> Any:
    """One pre-LayerNorm transformer block on ``x`` ([s, b, hidden]) with weights ``w`` (names: BLOCK_WEIGHTS).

    ``recompute``: ``"none"`` keeps what autodiff keeps; ``"selective"`` recomputes the attention core
    (Korthikanti et al., 2022: what grows as the sequence's square costs few FLOPs to redo); ``"full"`` keeps
    only the block's input and runs the whole block again in the backward pass.
    """
    if recompute == "full":
        names = list(w)
        rerun = tf.recompute_grad(lambda x, *values: block(x, dict(zip(names, values, strict=True)), heads))
        return rerun(x, *(tf.convert_to_tensor(w[name]) for name in names))
    attended = causal_attention(layer_norm(x, w["ln1_gamma"], w["ln1_beta"]), w["wq"], w["wk"], w["wv"], heads,
                                recompute=recompute == "selective")
    x = x + dense(attended, w["wo"]) + w["bo"]
    return x + mlp(layer_norm(x, w["ln2_gamma"], w["ln2_beta"]), w["w1"], w["b1"], w["w2"]) + w["b2"]


def embed(tokens: Any, token_embedding: Any, position_embedding: Any) -> Any:
    """Token ids [b, s] → the blocks' input [s, b, hidden]: each token's vector plus its position's."""
    x = tf.gather(token_embedding, tokens) + position_embedding[: tf.shape(tokens)[1]]
    return tf.transpose(x, [1, 0, 2])


def head_logits(x: Any, gamma: Any, beta: Any, head: Any) -> Any:
    """The blocks' output [s, b, hidden] → logits [b, s, vocab]: a final LayerNorm, then the head."""
    return tf.transpose(dense(layer_norm(x, gamma, beta), head), [1, 0, 2])


def forward(weights: dict[str, Any], tokens: Any, heads: int, recompute: str = "none") -> Any:
    """TinyGPT's logits [b, s, vocab] from its weights by name (``TinyGPT.weights_by_name``), as one function.

    The same ops as calling the model, on whatever tensors ``weights`` holds: plain tensors on one
    device, or DTensors laid out on a mesh (lesson 15). ``recompute`` is every block's (:func:`block`).
    """
    x = run_blocks(weights, embed(tokens, weights["token_embedding"], weights["position_embedding"]), heads,
                   recompute)
    return head_logits(x, weights["final_gamma"], weights["final_beta"], weights["lm_head"])


def run_blocks(weights: dict[str, Any], x: Any, heads: int, recompute: str = "none") -> Any:
    """Every block whose weights ``weights`` holds ("block0/wq", ...), in order, on ``x`` ([s, b, hidden])."""
    layers = sorted({name.split("/")[0] for name in weights if name.startswith("block")}, key=lambda b: int(b[5:]))
    for layer in layers:
        x = block(x, {name: weights[f"{layer}/{name}"] for name in BLOCK_WEIGHTS}, heads, recompute)
    return x


def next_token_loss(logits: Any, targets: Any) -> Any:
    """The mean cross-entropy of the next token at every position (what every lesson's TinyGPT trains on)."""
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True))


class Block(keras.layers.Layer):
    """A transformer block as a Keras layer: its weights are named as in BLOCK_WEIGHTS."""

    def __init__(self, hidden: int, heads: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hidden, self.heads = hidden, heads

    def build(self, input_shape: Any) -> None:
        h, normal = self.hidden, keras.initializers.RandomNormal(stddev=0.02)
        shapes = {"ln1_gamma": (h,), "ln1_beta": (h,), "wq": (h, h), "wk": (h, h), "wv": (h, h), "wo": (h, h),
                  "bo": (h,), "ln2_gamma": (h,), "ln2_beta": (h,), "w1": (h, 4 * h), "b1": (4 * h,),
                  "w2": (4 * h, h), "b2": (h,)}
        for name, shape in shapes.items():
            init = "ones" if name.endswith("gamma") else "zeros" if len(shape) == 1 else normal
            setattr(self, name, self.add_weight(shape=shape, initializer=init, name=name))

    def weights_by_name(self) -> dict[str, Any]:
        """The block's weights as tensors, by name (what :func:`block` and the split versions take)."""
        return {name: tf.convert_to_tensor(getattr(self, name)) for name in BLOCK_WEIGHTS}

    def call(self, x: Any) -> Any:
        return block(x, {name: getattr(self, name) for name in BLOCK_WEIGHTS}, self.heads)


class TinyGPT(keras.Model):
    """Token and position embeddings, ``layers`` blocks, a final LayerNorm and a language-model head.

    Takes token ids [batch, sequence] and returns logits [batch, sequence, vocab] for the next
    token at every position.
    """

    def __init__(self, vocab: int, seq_len: int, hidden: int, heads: int, layers: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.vocab, self.seq_len, self.hidden, self.heads = vocab, seq_len, hidden, heads
        normal = keras.initializers.RandomNormal(stddev=0.02)
        self.tokens = self.add_weight(shape=(vocab, hidden), initializer=normal, name="token_embedding")
        self.positions = self.add_weight(shape=(seq_len, hidden), initializer=normal, name="position_embedding")
        self.blocks = [Block(hidden, heads, name=f"block{i}") for i in range(layers)]
        self.final_gamma = self.add_weight(shape=(hidden,), initializer="ones", name="final_gamma")
        self.final_beta = self.add_weight(shape=(hidden,), initializer="zeros", name="final_beta")
        self.head = self.add_weight(shape=(hidden, vocab), initializer=normal, name="lm_head")
        for layer in self.blocks:
            layer.build((seq_len, None, hidden))
        self.built = True  # every weight exists already

    def embed(self, tokens: Any) -> Any:
        """Token ids [b, s] → the blocks' input [s, b, hidden]."""
        return embed(tokens, self.tokens, self.positions)

    def logits(self, x: Any) -> Any:
        """The blocks' output [s, b, hidden] → logits [b, s, vocab]."""
        return head_logits(x, self.final_gamma, self.final_beta, self.head)

    def weights_by_name(self) -> dict[str, Any]:
        """Every weight as a tensor, by the name :func:`forward` takes ("lm_head", "block0/wq", ...)."""
        weights = {"token_embedding": self.tokens, "position_embedding": self.positions,
                   "final_gamma": self.final_gamma, "final_beta": self.final_beta, "lm_head": self.head}
        weights = {name: tf.convert_to_tensor(w) for name, w in weights.items()}
        for i, layer in enumerate(self.blocks):
            weights.update({f"block{i}/{name}": w for name, w in layer.weights_by_name().items()})
        return weights

    def call(self, tokens: Any) -> Any:
        x = self.embed(tokens)
        for layer in self.blocks:
            x = layer(x)
        return self.logits(x)
