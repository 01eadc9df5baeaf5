"""Expert parallelism: a mixture-of-experts MLP with its experts spread over devices.

A mixture-of-experts (MoE) layer replaces one MLP by E of them, the experts, and a router that
sends each token to its top-k experts (Shazeer et al. 2017, "Outrageously Large Neural Networks", gave
the sparsely-gated layer to deep learning; Switch Transformer, Fedus et al. 2021: k = 1; GShard,
Lepikhin et al. 2020: k = 2). Each expert takes at most ``capacity`` tokens per group of tokens,
capacity = ⌈capacity factor · k · tokens per group / E⌉; a token routed to a full expert is
dropped there (its output for that expert is zero, and the block's residual carries it on). An
auxiliary loss, E · Σₑ fₑ · Pₑ (fₑ: the share of tokens whose first choice is expert e; Pₑ: the
router's mean probability for e), pushes the router towards an even load (Switch, equation 4): it is 1
whenever the choices are even, and E·Σₑ fₑ² (which grows as they skew) when the probabilities match them;
Switch weights it by α = 10⁻² (:data:`AUX_COEFFICIENT`). ST-MoE's router z-loss (Zoph et al. 2022), the mean
over tokens of (log Σₑ exp logitₑ)², weighted by 0.001 (:data:`Z_COEFFICIENT`), keeps the logits small.

The layer is written as GShard and Mesh TensorFlow write it, with dense dispatch and combine
tensors [group, token, expert, slot]: :func:`route` makes them, :func:`moe` runs the layer on one
device. :func:`expert_parallel` runs the same layer with the experts spread over N devices, each
device routing its own group of tokens: an all-to-all sends every device's slots to the devices
that hold their experts, the experts run, and a second all-to-all brings the outputs back
(:func:`collectives.all_to_all`). With groups = N it equals :func:`moe`, outputs and gradients.
:func:`expert_data_parallel` puts that inside data parallelism: replicas of e devices, the experts'
gradients summed over the replicas that hold them, the router's over every device.

The slots make every all-to-all the same size, empty slots and all: that is capacity padding, not expert
parallelism. A dropless MoE (MegaBlocks, Gale et al. 2023) drops no token and pads no slot: the devices first
exchange how many tokens each sends each expert, then an all-to-all of uneven sizes sends just those.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from mgpu_edu._validate import BadArgument, one_of, real_number, whole_number
from mgpu_edu.parallelism import collectives
from mgpu_edu.runtime import quiet

WEIGHTS = ("router", "w1", "b1", "w2")  #: router [h, E]; per expert w1 [E, h, f], b1 [E, f], w2 [E, f, h]
EXPERT_WEIGHTS = WEIGHTS[1:]  #: each expert's own weights (the router is dense: every device holds all of it)
AUX_COEFFICIENT = 1e-2  #: the auxiliary loss's weight in the training loss (Switch Transformer, §2.2: α = 10⁻²)
Z_COEFFICIENT = 1e-3  #: the router z-loss's weight (ST-MoE, Zoph et al. 2022, §3.3: c_z = 0.001)


@dataclasses.dataclass
class Routing:
    """Where a group of tokens goes: dense [group, token, expert, slot] dispatch (0 or 1) and combine
    (the gate) tensors, and the counts behind them, per group and expert."""

    dispatch: Any
    combine: Any
    capacity: int  #: slots per expert per group
    wanted: Any  #: [group, expert]: token choices routed to each expert (k per token), before capacity
    kept: Any  #: [group, expert]: those that found a slot
    aux_loss: Any  #: E · Σₑ fₑ · Pₑ, averaged over groups (1 when the load is even)
    z_loss: Any  #: the router z-loss, (log Σₑ exp(logitₑ))² averaged over the tokens (ST-MoE)

    @property
    def dropped(self) -> int:
        """Token choices that found their expert full."""
        return int(round(float(quiet.import_tensorflow().reduce_sum(self.wanted - self.kept))))


def random_weights(hidden: int, experts: int, ffn: int, seed: int = 0) -> dict[str, Any]:
    """A router and ``experts`` MLPs (hidden → ffn → hidden) with random float32 weights, named as :data:`WEIGHTS`."""
    tf = quiet.import_tensorflow()
    for name, value in (("hidden", hidden), ("experts", experts), ("ffn", ffn)):
        whole_number(name, value)
    init = tf.random.stateless_normal
    return {"router": init([hidden, experts], seed=[seed, 0]),
            "w1": init([experts, hidden, ffn], seed=[seed, 1]) / math.sqrt(hidden),
            "b1": tf.zeros([experts, ffn]),
            "w2": init([experts, ffn, hidden], seed=[seed, 2]) / math.sqrt(ffn)}


def capacity(tokens: int, experts: int, top_k: int = 1, capacity_factor: float = 1.25) -> int:
    """Slots per expert for a group of ``tokens``: ⌈capacity factor · k · tokens / E⌉ (at least 1).

    Example:
        >>> capacity(64, 8, top_k=1, capacity_factor=1.25), capacity(64, 8, top_k=2, capacity_factor=1.0)
        (10, 16)
    """
    whole_number("tokens", tokens, minimum=1)
    whole_number("experts", experts, minimum=1)
    one_of("top_k", top_k, (1, 2), hint="Switch routes each token to 1 expert, GShard to 2.")
    real_number("capacity_factor", capacity_factor, minimum=0.0, above=True,
                hint="1.0 gives each expert exactly its even share; the Switch Transformer used 1.0 to 2.0.")
    return max(1, math.ceil(round(capacity_factor * top_k * tokens / experts, 9)))  # 1.1·2·100/4 is 55, not 55.00…01


def route(logits: Any, top_k: int = 1, capacity_factor: float = 1.25, groups: int = 1) -> Routing:
    """Route tokens by the router's ``logits`` [tokens, experts], in ``groups`` equal groups of consecutive tokens.

    Each token goes to its ``top_k`` most probable experts with gate = the router's probability
    (top-2: the two probabilities scaled to sum to 1). Within a group, experts fill their
    ``capacity`` slots in token order, every token's first choice before any second choice;
    what finds its expert full is dropped.
    """
    tf = quiet.import_tensorflow()
    whole_number("groups", groups, minimum=1)
    tokens, experts = (int(n) for n in logits.shape)
    if tokens % groups:
        raise BadArgument(f"route: {tokens} tokens don't split into groups={groups} equal groups. Use a number of "
                          f"groups that divides {tokens}, e.g. {math.gcd(tokens, groups)}.")
    if top_k > experts:
        raise BadArgument(f"route: top_k={top_k} needs at least {top_k} experts, got {experts}.")
    size = tokens // groups
    slots = capacity(size, experts, top_k, capacity_factor)
    probs = tf.nn.softmax(tf.reshape(logits, [groups, size, experts]), axis=-1)
    top, index = tf.math.top_k(probs, k=top_k)
    gates = top / tf.reduce_sum(top, axis=-1, keepdims=True) if top_k > 1 else top
    dispatch = tf.zeros([groups, size, experts, slots], probs.dtype)
    combine = tf.zeros_like(dispatch)
    requested = tf.zeros([groups, experts], probs.dtype)  # choices routed to each expert so far, dropped or not
    for choice in range(top_k):
        chosen = tf.one_hot(index[..., choice], experts, dtype=probs.dtype)  # [group, token, expert]
        # each choice's place in its expert's queue: the choices before it in this round, and all earlier rounds'
        position = (tf.cumsum(chosen, axis=1, exclusive=True) + requested[:, None, :]) * chosen
        requested += tf.reduce_sum(chosen, axis=1)
        fits = chosen * tf.cast(position < slots, probs.dtype)  # the first `slots` in the queue get a slot
        # a token's slot number (its place, summed over the one expert it chose), one-hot over the slots
        slot = tf.one_hot(tf.cast(tf.reduce_sum(position * fits, axis=-1), tf.int32), slots, dtype=probs.dtype)
        placed = fits[..., None] * slot[:, :, None, :]  # [group, token, expert, slot]
        dispatch += placed
        combine += gates[..., choice, None, None] * placed
    first = tf.one_hot(index[..., 0], experts, dtype=probs.dtype)
    balance = experts * tf.reduce_sum(tf.reduce_mean(first, axis=1) * tf.reduce_mean(probs, axis=1), axis=-1)
    z_loss = tf.reduce_mean(tf.square(tf.reduce_logsumexp(logits, axis=-1)))
    return Routing(dispatch, combine, slots, requested, tf.reduce_sum(dispatch, axis=[1, 3]), tf.reduce_mean(balance),
                   z_loss)


def experts_mlp(inputs: Any, w1: Any, b1: Any, w2: Any) -> Any:
    """Each expert's MLP, GELU(x·w1 + b1)·w2, on its own slots: ``inputs`` [experts, …, hidden]."""
    tf = quiet.import_tensorflow()
    hidden = tf.nn.gelu(tf.einsum("e...h,ehf->e...f", inputs, w1) + _expand(tf, b1, inputs))
    return tf.einsum("e...f,efh->e...h", hidden, w2)


def _expand(tf: Any, bias: Any, like: Any) -> Any:
    """b [E, f] shaped to add to [E, …, f]."""
    return tf.reshape(bias, [bias.shape[0]] + [1] * (len(like.shape) - 2) + [bias.shape[-1]])


def moe(x: Any, weights: dict[str, Any], top_k: int = 1, capacity_factor: float = 1.25,
        groups: int = 1) -> tuple[Any, Routing]:
    """The mixture-of-experts MLP on one device: ``x`` [tokens, hidden] → (output [tokens, hidden], routing)."""
    tf = quiet.import_tensorflow()
    tokens, hidden = (int(n) for n in x.shape)
    routing = route(tf.matmul(x, weights["router"]), top_k, capacity_factor, groups)
    grouped = tf.reshape(x, [groups, tokens // groups, hidden])
    slots = tf.einsum("gtec,gth->egch", routing.dispatch, grouped)  # each expert's slots, from every group
    out = experts_mlp(slots, weights["w1"], weights["b1"], weights["w2"])
    return tf.reshape(tf.einsum("gtec,egch->gth", routing.combine, out), [tokens, hidden]), routing


@dataclasses.dataclass
class ExpertRun:
    """An expert-parallel forward pass: each device's output and routing, both all-to-alls' traces, and
    ``tokens[i][j]``, the slots device i sent to device j that carried a token (counted from i's dispatch, so a
    token of zeros counts too; a top-2 token may fill two of them)."""

    outputs: list[Any]
    routings: list[Routing]
    dispatch: Any
    combine: Any
    tokens: list[list[int]]

    def whole_output(self) -> Any:
        """Every device's output in token order: [tokens, hidden]."""
        tf = quiet.import_tensorflow()
        return tf.concat(self.outputs, axis=0)


def expert_parallel(x: Any, weights: dict[str, Any] | Sequence[dict[str, Any]], devices: Sequence[str],
                    top_k: int = 1, capacity_factor: float = 1.25) -> ExpertRun:
    """The mixture-of-experts MLP with its E experts spread over N devices, E/N each, in order.

    Device d routes group d of the tokens (``x`` cut into N equal groups), fills a buffer of
    [E, capacity, hidden] slots, and one all-to-all sends each device's share of it to the device
    that holds those experts; each device runs its experts on the slots from every device, and a
    second all-to-all sends the outputs back, where each token's outputs are weighted by its gates.
    Equals ``moe(x, weights, top_k, capacity_factor, groups=N)``. ``weights`` is the whole layer's (each
    device takes a copy of the router and its E/N experts), or one dict per device with the router and that
    device's E/N experts (its own copy, as :func:`expert_data_parallel` passes them).
    """
    tf = quiet.import_tensorflow()
    devices, n = list(devices), len(devices)
    if not devices:
        raise BadArgument("expert_parallel needs at least one device, got an empty list.")
    tokens, hidden = (int(v) for v in x.shape)
    whole = isinstance(weights, dict)
    experts = int((weights if whole else weights[0])["router"].shape[-1])
    if experts % n:
        raise BadArgument(f"expert_parallel: {experts} experts don't spread evenly over {n} devices. Use a number of "
                          f"devices that divides {experts}.")
    if tokens % n:
        raise BadArgument(f"expert_parallel: {tokens} tokens don't cut into {n} equal groups, one per device. Use a "
                          f"batch whose tokens divide by {n}.")
    if not whole and len(weights) != n:
        raise BadArgument(f"expert_parallel: got {len(weights)} devices' weights for {n} devices; pass one dict per "
                          "device, or the whole layer's weights as one dict.")
    local, size = experts // n, tokens // n
    routings, buffers, mine = [], [], []
    tokens_sent = [[0] * n for _ in range(n)]
    for d, device in enumerate(devices):
        with tf.device(device):
            if whole:  # this device's copy: the router, and its own E/N experts
                own = slice(d * local, (d + 1) * local)
                mine.append({"router": tf.identity(weights["router"]),
                             **{name: tf.identity(weights[name][own]) for name in EXPERT_WEIGHTS}})
            else:
                mine.append(weights[d])
            group = x[d * size:(d + 1) * size]
            routing = route(tf.matmul(group, mine[d]["router"]), top_k, capacity_factor)
            routings.append(routing)
            slots = tf.einsum("tec,th->ech", routing.dispatch[0], group)  # [E, C, h]: device j's experts are rows j
            # the slots each device's experts get from this one, counted from the dispatch (a token may be zeros)
            taken = tf.reshape(tf.reduce_sum(routing.dispatch[0], axis=0), [n, local * routing.capacity])
            for j, count in enumerate(tf.reduce_sum(taken, axis=1).numpy().tolist()):
                tokens_sent[d][j] = int(round(count))
            buffers.append(tf.reshape(slots, [experts * routing.capacity, hidden]))
    slots_per = routings[0].capacity
    received, dispatch = collectives.all_to_all(buffers, trace=True)
    outputs = []
    for j, device in enumerate(devices):
        with tf.device(device):
            arrived = tf.reshape(received[j], [n, local, slots_per, hidden])  # [source, my expert, slot, h]
            done = experts_mlp(tf.transpose(arrived, [1, 0, 2, 3]), *(mine[j][name] for name in EXPERT_WEIGHTS))
            outputs.append(tf.reshape(tf.transpose(done, [1, 0, 2, 3]), [n * local * slots_per, hidden]))
    back, combine = collectives.all_to_all(outputs, trace=True)
    results = []
    for d, device in enumerate(devices):
        with tf.device(device):
            out = tf.reshape(back[d], [experts, slots_per, hidden])  # my slots' outputs, every expert in order
            results.append(tf.einsum("tec,ech->th", routings[d].combine[0], out))
    return ExpertRun(results, routings, dispatch, combine, tokens_sent)


@dataclasses.dataclass
class ExpertDataRun:
    """Expert parallelism inside data parallelism (:func:`expert_data_parallel`): the output, each device's
    gradients before and after the reductions, and what the reductions sent.

    ``gradients`` holds the whole layer's gradients put together from the reduced ones (the router from device 0,
    the experts from the first replica, in order; ``"x"`` from every device's tokens): what one device computes.
    ``reduced_bytes`` is, per device, the bytes it sent in the two all-reduces: ``"dense"`` (the router, over all
    N devices) and ``"experts"`` (its E/e experts, over the N/e devices that hold them).
    """

    output: Any
    gradients: dict[str, Any]
    local: list[dict[str, Any]]  #: each device's gradients from its own tokens, before any reduction
    reduced: list[dict[str, Any]]  #: each device's gradients after the reductions
    runs: list[ExpertRun]  #: one expert-parallel run per replica
    replicas: list[list[int]]  #: the devices of each replica: an expert-parallel group, experts in device order
    reduced_bytes: dict[str, list[int]]


def expert_data_parallel(x: Any, weights: dict[str, Any], devices: Sequence[str], expert_degree: int,
                         out_grad: Any, top_k: int = 1, capacity_factor: float = 1.25,
                         aux_coefficient: float = AUX_COEFFICIENT,
                         z_coefficient: float = Z_COEFFICIENT) -> ExpertDataRun:
    """Expert parallelism of degree e inside data parallelism: N devices as N/e replicas of e devices.

    Every device takes its own group of the tokens (N groups, as ``moe(..., groups=N)``) and holds the whole
    router and E/e experts; the e devices of a replica (devices r·e … r·e + e − 1) hold all E experts between them
    and exchange slots with :func:`expert_parallel`'s two all-to-alls. The loss is Σ output · ``out_grad`` plus
    ``aux_coefficient`` · the auxiliary loss and ``z_coefficient`` · the z-loss (each averaged over the groups).
    Each device's gradients come from its own tokens; then the dense router's gradient is all-reduced over all N
    devices, and each expert's over the N/e devices that hold a copy of it (same place in each replica), never
    over the others. The result equals one device's gradients. (One ``tf.GradientTape`` computes every device's
    gradients, on one device, as lesson 14 says; each is then placed on its device before the all-reduces.)
    """
    tf = quiet.import_tensorflow()
    devices, n = list(devices), len(devices)
    whole_number("expert_degree", expert_degree, minimum=1)
    experts = int(weights["router"].shape[-1])
    if not devices or n % expert_degree:
        raise BadArgument(f"expert_data_parallel: expert_degree={expert_degree} must divide the number of devices "
                          f"({n}): the devices form N/e replicas of e. Use a degree that divides {n}.")
    if experts % expert_degree:
        raise BadArgument(f"expert_data_parallel: expert_degree={expert_degree} must divide the {experts} experts.")
    if int(x.shape[0]) % n:
        raise BadArgument(f"expert_data_parallel: {int(x.shape[0])} tokens don't cut into {n} equal groups, one per "
                          f"device. Use a batch whose tokens divide by {n}.")
    e, local = expert_degree, experts // expert_degree
    replicas = [list(range(r * e, (r + 1) * e)) for r in range(n // e)]
    size = int(x.shape[0]) // n
    copies = []
    for d, device in enumerate(devices):
        with tf.device(device):
            shard = d % e  # which E/e experts: the same shard in every replica
            copies.append({"router": tf.identity(weights["router"]),
                           **{name: tf.identity(weights[name][shard * local:(shard + 1) * local])
                              for name in EXPERT_WEIGHTS}})
    with tf.GradientTape() as tape:
        tape.watch([x, copies])
        runs = [expert_parallel(x[group[0] * size:(group[-1] + 1) * size], [copies[d] for d in group],
                                [devices[d] for d in group], top_k, capacity_factor) for group in replicas]
        output = tf.concat([run.whole_output() for run in runs], axis=0)
        routings = [r for run in runs for r in run.routings]
        loss = (tf.reduce_sum(output * out_grad)
                + aux_coefficient * tf.add_n([r.aux_loss for r in routings]) / n
                + z_coefficient * tf.add_n([r.z_loss for r in routings]) / n)
    d_x, d_copies = tape.gradient(loss, [x, copies])
    grads = []
    for d, device in enumerate(devices):
        with tf.device(device):
            grads.append({name: tf.identity(g) for name, g in d_copies[d].items()})
    reduced = [dict(g) for g in grads]
    sent = {"dense": [0] * n, "experts": [0] * n}
    summed, record = collectives.all_reduce([g["router"] for g in grads], trace=True)
    for d in range(n):
        reduced[d]["router"], sent["dense"][d] = summed[d], record.bytes_sent[d]
    for shard in range(e):
        holders = list(range(shard, n, e))  # the devices with this shard of the experts, one per replica
        for name in EXPERT_WEIGHTS:
            summed, record = collectives.all_reduce([grads[d][name] for d in holders], trace=True)
            for i, d in enumerate(holders):
                reduced[d][name] = summed[i]
                sent["experts"][d] += record.bytes_sent[i]
    with tf.device(devices[0]):
        gradients = {"router": tf.identity(reduced[0]["router"]), "x": d_x,
                     **{name: tf.concat([reduced[d][name] for d in replicas[0]], axis=0) for name in EXPERT_WEIGHTS}}
    return ExpertDataRun(output, gradients, grads, reduced, runs, replicas, sent)


def formula_bytes(n: int, experts: int, capacity: int, hidden: int, itemsize: int = 4) -> float:
    """Bytes each device sends in one all-to-all of its slots: (N−1)/N of E · capacity · hidden values.

    Example:
        >>> formula_bytes(4, experts=8, capacity=10, hidden=32)
        7680.0
    """
    return float((n - 1) * (experts // n) * capacity * hidden * itemsize)
