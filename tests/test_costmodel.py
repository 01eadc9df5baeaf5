"""The scaling model: its invariants and its bad inputs (pure arithmetic)."""

from __future__ import annotations

import math

import pytest

from mgpu_edu import costmodel
from mgpu_edu.analysis.costmodel import speedup, step_time

BASE = {"params": 25.6e6, "flops_per_example": 24.6e9, "batch_per_replica": 64, "device_tflops": 8.1,
        "link_gbytes_per_s": 12.0}


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_ring_time_is_the_formula(n):
    t = step_time(**BASE, replicas=n, latency_s=0)
    expected = 2 * (n - 1) / n * BASE["params"] * 4 / (BASE["link_gbytes_per_s"] * 1e9)
    assert t.comm_s == pytest.approx(expected)
    with_latency = step_time(**BASE, replicas=n, latency_s=1e-5)
    assert with_latency.comm_s == pytest.approx(expected + 2 * (n - 1) * 1e-5)


@pytest.mark.parametrize("algorithm", ["ring", "reduce_to_one", "tree"])
def test_one_replica_communicates_nothing(algorithm):
    t = step_time(**BASE, replicas=1, algorithm=algorithm)
    assert t.comm_s == 0 and t.total_s == t.compute_s
    assert speedup(**BASE, replicas=1, algorithm=algorithm) == pytest.approx(1.0)


def test_compute_and_speedup_invariants():
    t = step_time(**BASE, replicas=4)
    assert t.compute_s == pytest.approx(24.6e9 * 64 / 8.1e12)
    assert t.total_s == pytest.approx(t.compute_s + t.comm_s)
    curve = costmodel.scaling(BASE["params"], BASE["flops_per_example"], 64, 16, device_tflops=8.1,
                              link_gbytes_per_s=12.0)
    assert all(1 <= s <= n + 1e-9 for s, n in zip(curve["speedup"], curve["replicas"], strict=True))
    assert curve["efficiency"] == sorted(curve["efficiency"], reverse=True)  # efficiency only falls
    infinite_link = speedup(**{**BASE, "link_gbytes_per_s": 1e12}, replicas=8, latency_s=0)
    assert infinite_link == pytest.approx(8, rel=1e-6)
    hidden = step_time(**BASE, replicas=4, overlap=1.0)
    assert hidden.total_s == pytest.approx(max(hidden.compute_s, hidden.comm_s))
    assert speedup(**BASE, replicas=8, algorithm="reduce_to_one") < speedup(**BASE, replicas=8, algorithm="ring")


def test_cassava_tutorial_prediction():
    flops = costmodel.training_flops(4.1e9)  # ResNet-50: 4.1 G multiply-adds forward
    assert flops == pytest.approx(24.6e9)
    sustained = flops * 5656 / 100 / 1e12  # what the one-GPU epoch of 100 s delivered
    assert sustained / costmodel.PEAK_TFLOPS["T4"]["fp32"] == pytest.approx(0.172, abs=1e-3)
    two = step_time(25.6e6, flops, 64, 2, device_tflops=sustained, link_gbytes_per_s=12)
    predicted = math.ceil(5656 / 128) * two.total_s
    assert 50 < predicted < 52  # the model explains 100 s → ~51 s; the tutorial measured 60 s


@pytest.mark.parametrize(("change", "match"), [
    ({"params": 0}, "params=0"), ({"flops_per_example": -1}, "flops_per_example=-1"),
    ({"batch_per_replica": 2.5}, "batch_per_replica=2.5"), ({"replicas": 0}, "replicas=0"),
    ({"device_tflops": "fast"}, "device_tflops='fast'"), ({"link_gbytes_per_s": 0}, "link_gbytes_per_s=0"),
    ({"algorithm": "butterfly"}, "algorithm='butterfly'"), ({"latency_s": -1}, "latency_s=-1"),
    ({"overlap": 1.5}, "overlap=1.5"), ({"bytes_per_param": True}, "bytes_per_param=True")])
def test_bad_values(change, match):
    arguments = {**BASE, "replicas": 2, **change}
    with pytest.raises(ValueError, match=match.replace("(", r"\(")):
        step_time(**arguments)


@pytest.mark.widgets
def test_widgets_draw():
    from mgpu_edu.display.widgets import PipelineExplorer, ScalingSimulator

    simulator = ScalingSimulator()
    assert "16 replicas" in simulator.info.value and simulator.image.value[:4] == b"\x89PNG"
    simulator.precision.value = "mixed"
    assert simulator.options()["device_tflops"] == costmodel.PEAK_TFLOPS["T4"]["mixed"]  # share of peak: 100 %
    simulator.utilisation.value = 0.25
    assert simulator.options()["device_tflops"] == pytest.approx(costmodel.PEAK_TFLOPS["T4"]["mixed"] / 4)
    assert simulator.options()["bytes_per_param"] == 4  # Keras's mixed precision all-reduces float32 gradients
    simulator.precision.value = "tf32"  # a T4 has no TF32: its float32 rate
    assert simulator.options()["device_tflops"] == pytest.approx(costmodel.PEAK_TFLOPS["T4"]["fp32"] / 4)
    simulator.device.value = "A100"
    assert simulator.options()["device_tflops"] == pytest.approx(costmodel.PEAK_TFLOPS["A100"]["tf32"] / 4)
    for bad in (0, 1.5, "high"):
        with pytest.raises(ValueError, match="utilisation="):
            ScalingSimulator(utilisation=bad)
    explorer = PipelineExplorer(4, 4)
    explorer.micro_batches.value = 28
    assert "9.7%" in explorer.info.value and "GPipe <b>28</b>, 1F1B <b>4</b>" in explorer.info.value
    assert explorer.in_flight() == {"GPipe": [28] * 4, "1F1B": [4, 3, 2, 1]}
    with pytest.raises(ValueError, match="stages=0"):
        PipelineExplorer(0, 4)
