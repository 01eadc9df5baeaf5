"""Each axis's communication threshold against the α-β cost model, and against the JAX scaling book's figures."""

from __future__ import annotations

import pytest

from mgpu_edu import roofline


@pytest.mark.parametrize("name", list(roofline.DEVICES))
@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_each_threshold_is_where_the_cost_model_turns(name, n):
    """Below the threshold the collective takes longer than the compute it can hide behind; above, shorter."""
    device = roofline.DEVICES[name]
    for inside in (True, False):
        tokens = roofline.data_parallel_tokens(device, n, inside)
        for axis in ("data", "fsdp"):
            for factor, bound in ((0.5, True), (1.0, None), (2.0, False)):
                compute, comm = roofline.axis_seconds(axis, device, n, factor * tokens, 4096, 16384, inside)
                if bound is None:
                    assert compute == pytest.approx(comm, rel=1e-12)
                else:
                    assert (comm > compute) is bound
        width = roofline.tensor_parallel_width(device, n, inside)
        for factor, bound in ((0.5, True), (1.0, None), (2.0, False)):
            compute, comm = roofline.axis_seconds("tensor", device, n, 2048, 4096, factor * width, inside)
            assert compute == pytest.approx(comm, rel=1e-12) if bound is None else (comm > compute) is bound


def test_the_scaling_books_h100_figures():
    """JAX scaling book, GPU chapter ("Rooflines for LLM Scaling on GPUs"): per-GPU tokens for data parallelism
    and FSDP above 990e12 / 450e9 = 2200 inside a node (NVLink, 450 GB/s one way), and 990e12 / 400e9 = 2475 across
    nodes (each node's 400 GB/s of network, as a hierarchical all-reduce uses it); tensor parallelism
    communication-bound for Y > F / 2475; an H100's critical intensity 990e12 / 3.35e12 = 295. The book rounds the
    H100's 989 TFLOP/s to 990; the course's datasheet figure gives the same to within 0.1 %."""
    h100 = roofline.DEVICES["H100"]
    assert round(h100.flops / h100.intra_bandwidth, -2) == 2200
    assert round(roofline.data_parallel_tokens(h100, 10**6), -2) == 2200  # (N − 1)/N → 1
    node = roofline.Device(h100.flops, h100.memory_bandwidth, h100.intra_bandwidth, 8 * h100.inter_bandwidth)
    assert round(roofline.data_parallel_tokens(node, 10**6, inside=False)) == 2472  # the book's 2475 at 990e12
    assert round(roofline.critical_intensity(h100)) == 295
    # Y < F·W/C: the width at which degree Y turns is (Y − 1)·C/W, so F / (C/W) is Y − 1 there
    assert roofline.tensor_parallel_width(node, 8, inside=False) / (h100.flops / 400e9) == pytest.approx(7)


def test_matmul_intensity_is_about_the_batch_when_it_is_small():
    assert roofline.matmul_intensity(64, 8192, 8192) == pytest.approx(64, rel=0.02)
    assert roofline.matmul_intensity(8192, 8192, 8192) == pytest.approx(8192 / 3)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="axis='pipeline'"):
        roofline.axis_seconds("pipeline", roofline.DEVICES["T4"], 2, 100, 8, 8)
    with pytest.raises(ValueError, match="n=1"):
        roofline.data_parallel_tokens(roofline.DEVICES["T4"], 1)
    with pytest.raises(ValueError, match="degree=1"):
        roofline.tensor_parallel_width(roofline.DEVICES["T4"], 1)


def test_the_overlap_explorer_follows_the_rooflines():
    """Lesson 18's widget: each control redraws, and its verdict and threshold are roofline's."""
    from mgpu_edu import widgets

    explorer = widgets.OverlapExplorer("fsdp", "H100", size=1024)
    h100 = roofline.DEVICES["H100"]
    compute, comm = roofline.axis_seconds("fsdp", h100, 8, 1024, 4096, 16384)
    assert explorer.seconds() == (compute, comm) and comm > compute
    assert "communication-bound" in explorer.info.value and "≈ <b>1,923</b>" in explorer.info.value
    picture = explorer.image.value
    explorer.size.value = 4096
    assert "compute-bound" in explorer.info.value and explorer.image.value != picture
    explorer.axis.value = "tensor"
    assert f"≈ <b>{roofline.tensor_parallel_width(h100, 8):,.0f}</b>" in explorer.info.value
    explorer.device.value = "T4"
    assert explorer.threshold() == roofline.tensor_parallel_width(roofline.DEVICES["T4"], 8)
    with pytest.raises(ValueError, match="axis='pipeline'"):
        widgets.OverlapExplorer("pipeline")
