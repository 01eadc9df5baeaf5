"""The planner: its counts against published figures, its layouts, its puzzles' feedback (no TensorFlow here;
lesson 16 checks its predictions against a real 3-D run)."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from mgpu_edu import check, memory, planner
from mgpu_edu._validate import BadArgument

TINY = planner.Model(layers=2, hidden=32, heads=4, seq=16, vocab=64)


def test_published_parameter_counts():
    """GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, d_model 12,288, 96 heads, 2,048 tokens; its head is
    tied, so one V·h less) and MT-NLG 530B (Smith et al. 2022: 105 layers, hidden 20,480, 128 heads)."""
    gpt3 = planner.Model(layers=96, hidden=12288, heads=96, seq=2048, vocab=50257)
    assert abs((gpt3.params - 50257 * 12288) / 175.0e9 - 1) < 0.005
    mt_nlg = planner.Model(layers=105, hidden=20480, heads=128, seq=2048, vocab=51200)
    assert abs(mt_nlg.params / 530e9 - 1) < 0.005


def test_zero_papers_memory_figures_through_the_planner():
    """ZeRO (Rajbhandari et al. 2020, Figure 1): 7.5 B parameters, 64 GPUs, mixed-precision Adam:
    120, 31.4, 16.6 and 1.9 GB of model states per GPU for stages 0 to 3."""
    model = planner.Model(layers=1, hidden=1, heads=1, seq=1, vocab=1)
    figures = []
    for stage in range(4):
        states = memory.model_states(7.5e9, 64, stage)
        figures.append(round(states.total / 1e9, 1))
        layout = planner.Layout(64, 1, 1, zero=stage)
        p = planner.predict(model, layout)
        per_param = memory.model_states(p.params_per_device, 64, stage)
        assert p.held["optimizer"] == per_param.optimizer and p.held["weights"] == per_param.params
    assert figures == [120.0, 31.4, 16.6, 1.9]


def test_tiny_gpt_counts():
    layout = planner.Layout(2, 2, 2, zero=1, micro_batches=4, recompute="stage", sequence_parallel=False)
    first = planner.predict(TINY, layout, precision="fp32", stage=0)
    last = planner.predict(TINY, layout, precision="fp32", stage=1)
    assert (first.params_per_device, last.params_per_device) == (8960, 8512)
    assert planner.params_per_device(TINY, planner.Layout(1, 1, 1)) == TINY.params == 29888
    assert first.sent == {"tensor": 40960.0, "pipeline": 8192.0, "data": 35840.0, "context": 0.0, "expert": 0.0}
    assert last.sent["tensor"] == 49152.0 and last.held["activations"] == 2048.0 and first.held["activations"] == 128
    layer = memory.transformer_activations(16, 1, 32, 4, 2, False, "none", 4)  # one layer, recomputed at a time
    assert last.held["working"] == 16 * 64 * 4 + layer  # plus the loss's float32 logits on the last stage
    assert first.held["working"] == layer


def test_sequence_parallelism_is_on_with_tensor_parallelism_and_splits_what_it_left_whole():
    """On by default whenever tensor > 1; a quarter more tensor bytes (an all-gather and a reduce-scatter move what
    one all-reduce does, and the backward gathers each block's two linear inputs again), a t-th of the pipeline's,
    and less kept: Korthikanti et al.'s 10 whole bytes split too."""
    assert planner.Layout(2, 2, 1).sequence_parallel
    assert not planner.Layout(2, 1, 1, sequence_parallel=True).sequence_parallel  # nothing to split it over
    model = planner.Model(layers=4, hidden=64, heads=4, seq=64, vocab=64)
    on, off = (planner.predict(model, planner.Layout(1, 4, 2, micro_batches=4, sequence_parallel=sp))
               for sp in (True, False))
    assert on.sent["tensor"] == 1.25 * off.sent["tensor"] and on.sent["pipeline"] == off.sent["pipeline"] / 4
    assert on.held["activations"] < off.held["activations"] and "TP 4 (SP)" in on.layout.describe()


def test_uneven_stages_hold_their_own_blocks_and_the_outer_stages_the_embedding_and_head():
    """126 layers on 16 stages, as Llama 3 split them: the stages' parameters add up to the model's, and the
    first stage's weights are not the model's sixteenth."""
    model = planner.Model(layers=126, hidden=256, heads=4, seq=64, vocab=1000)
    layout = planner.Layout(1, 1, 16)
    counts = [planner.params_per_device(model, layout, s) for s in range(16)]
    assert sum(counts) == model.params and counts[0] != model.params // 16
    assert counts[1] == counts[8] and counts[0] - counts[1] == model.vocab * 256 + 64 * 256 - counts[1] // 8
    tied = dataclasses.replace(model, tied_embeddings=True)  # the last stage keeps a copy of the table for its head
    assert planner.params_per_device(tied, layout, 15) == planner.params_per_device(model, layout, 15)
    assert sum(planner.params_per_device(tied, layout, s) for s in range(16)) == tied.params + tied.vocab * 256


def test_interleaving_shrinks_the_bubble_and_sends_more():
    model, cluster, batch, _ = planner.PUZZLES["65B on 64 H100s"]
    plain = planner.Layout(8, 1, 8, zero=1, micro_batch=2, micro_batches=64, recompute="full")
    two = dataclasses.replace(plain, virtual_stages=2)
    p1, p2 = planner.predict(model, plain, cluster), planner.predict(model, two, cluster)
    assert p2.sent["pipeline"] > p1.sent["pipeline"] and p2.held["activations"] > p1.held["activations"]
    assert p2.seconds < p1.seconds and p1.mfu < p2.mfu < cluster.efficiency


def test_stage_none_reports_the_worst_stage_of_each_quantity():
    """A middle stage sends activations forward and gradients back: the most bytes, though not the most memory."""
    three = planner.Model(layers=3, hidden=32, heads=4, seq=16, vocab=64)
    layout = planner.Layout(1, 1, 3, micro_batches=4)
    each = [planner.predict(three, layout, stage=s) for s in range(3)]
    assert [p.sent_total for p in each] == [4096.0, 8192.0, 4096.0]
    worst = planner.predict(three, layout)
    assert worst.sent_total == 8192.0 and worst.held_total == max(p.held_total for p in each)
    model, cluster, batch, limit = planner.PUZZLES["65B on 64 H100s"]
    answer = planner.Layout(8, 1, 8, zero=1, micro_batch=2, micro_batches=64, recompute="full")
    assert round(planner.predict(model, answer, cluster).sent_total / 1e9, 2) == 45.37 < limit / 1e9


def test_plan_keeps_what_fits_and_ranks_by_time():
    model, cluster, batch, limit = planner.PUZZLES["65B on 64 H100s"]
    found = planner.plan(model, cluster, batch, max_sent=limit)
    assert found, "the 65B puzzle must have solutions"
    assert all(p.fits and p.sent_total <= limit for p in found)
    assert [p.seconds for p in found] == sorted(p.seconds for p in found)
    assert all(planner.judge("65B on 64 H100s", p.layout) == "" for p in found[:5])


@pytest.mark.parametrize(("layout", "words"), [
    (planner.Layout(64, 1, 1, zero=0, micro_batch=16), "on its fullest device"),
    (planner.Layout(8, 8, 1, zero=1, micro_batch=2, micro_batches=64, recompute="full"), "most of it on the tensor"),
    (planner.Layout(64, 1, 1, zero=3, micro_batch=8, micro_batches=2, recompute="full"), "the largest part is working"),
    (planner.Layout(32, 1, 1, zero=3, micro_batch=8), "global batch is 1024"),
    (planner.Layout(32, 1, 1, zero=3, micro_batch=16, micro_batches=2), "job has 64"),
    ("DP 4", "expected a planner.Layout"),
])
def test_judge_says_why(layout, words):
    assert words in planner.judge("65B on 64 H100s", layout)


def test_puzzle_checks():
    model, cluster, batch, limit = planner.PUZZLES["65B on 64 H100s"]
    best = planner.plan(model, cluster, batch, max_sent=limit)[0].layout
    assert check.planner_puzzle(best, "65B on 64 H100s").correct
    assert check.planner_puzzle(..., "65B on 64 H100s").status == "unsolved"
    wrong = check.planner_puzzle(planner.Layout(8, 1, 1, zero=0, micro_batch=8), "6.7B on 8 T4s")
    assert wrong.status == "wrong" and "fullest device" in wrong.message and "recomputation" in wrong.message


def test_bad_layouts_get_clear_errors():
    with pytest.raises(BadArgument, match="pipeline=3 is more stages than the 2 layers"):
        planner.params_per_device(TINY, planner.Layout(1, 1, 3))
    with pytest.raises(BadArgument, match=r"virtual_stages=2 .* a multiple of pipeline=2 \(it has 3\)"):
        planner.predict(TINY, planner.Layout(1, 1, 2, micro_batches=3, virtual_stages=2))
    with pytest.raises(BadArgument, match="reshard=False keeps ZeRO-3's gathered weights; zero=2"):
        planner.predict(TINY, planner.Layout(2, 1, 1, zero=2, reshard=False))
    with pytest.raises(BadArgument, match="tensor=2 must divide .* the 1 key/value heads"):
        planner.predict(dataclasses.replace(TINY, kv_heads=1), planner.Layout(1, 2, 1))
    with pytest.raises(BadArgument, match="kv_heads=3 must divide heads"):
        dataclasses.replace(TINY, kv_heads=3)
    with pytest.raises(BadArgument, match="must divide the 4 heads"):
        planner.predict(TINY, planner.Layout(1, 3, 1))
    with pytest.raises(BadArgument, match="recompute"):
        planner.predict(TINY, planner.Layout(1, 1, 1, recompute="all"))


@pytest.mark.light  # starts processes, none of which imports TensorFlow
def test_planner_imports_no_tensorflow():
    import subprocess

    done = subprocess.run([sys.executable, "-c", "import sys; from mgpu_edu import planner; "
                           "planner.plan(*planner.PUZZLES['6.7B on 8 T4s'][:3]); print('tensorflow' in sys.modules)"],
                          capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "False"


def test_run_explorer_follows_the_planner():
    """Lesson 17's widget: one axis changed on the run's devices and global batch, counted as planner.predict counts
    it; a layout the devices can't take is explained, not raised."""
    from mgpu_edu.display.widgets import RunExplorer

    explorer = RunExplorer()
    run = planner.PUBLISHED[explorer.run.value]
    assert explorer.layout() == run.layout and f"~{run.predict().seconds:,.1f} s" in explorer.info.value
    explorer.controls["tensor"].value = 4  # two replicas now, 32 micro-batches each
    layout = explorer.layout()
    assert (layout.data, layout.tensor, layout.micro_batches) == (2, 4, 32)
    assert f"<b>{run.predict(layout).held_total / 2**30:,.1f} GiB</b>" in explorer.info.value
    explorer.controls["pipeline"].value = 32  # 4 × 32 devices: more than the run's 64
    assert "= 128 doesn&#x27;t divide the run&#x27;s 64 devices" in explorer.info.value
    explorer.run.value = "Llama 3 405B on 8,192 H100s, 8K context"  # every control back to that run's layout
    assert explorer.layout() == planner.PUBLISHED[explorer.run.value].layout
    with pytest.raises(BadArgument, match="run='GPT-5'"):
        RunExplorer("GPT-5")


def test_exercise_puzzles_have_answers_and_say_why_a_split_that_adds_micro_batches_doesnt_help():
    """Lesson 16's exercise 2 (13 B on two nodes of T4s) and lesson 17's (Llama 3 at 128K tokens, counted as the
    published run is): the reference answers fit; the feedback names the first stage's micro-batches in flight when
    more context parallelism only adds micro-batches."""
    assert planner.judge("13B on 16 T4s", planner.Layout(4, 2, 2, zero=3, micro_batches=16, recompute="full")) == ""
    assert "activations" in planner.judge("13B on 16 T4s", planner.Layout(16, 1, 1, zero=1, micro_batches=4))
    job = "Llama 3 405B at 128K tokens on 16,384 H100s"
    assert planner.judge(job, planner.Layout(8, 8, 16, 16, zero=3, reshard=False, micro_batches=16)) == ""
    for context in (1, 2, 8):
        layout = planner.Layout(128 // context, 8, 16, context, zero=3, reshard=False, micro_batches=context)
        said = planner.judge(job, layout)
        assert "the largest part is activations" in said and "keeps every one in flight" in said, said
    assert planner.PUZZLE_OPTIONS[job] == {"precision": "mixed_fp32_grads", "split_embeddings": True}
    assert not set(planner.WIDGET_JOBS) & {"13B on 16 T4s", "65B at 32K tokens on 64 H100s", job}


def test_the_advice_for_model_states_says_what_can_still_split_them():
    """With one data × context device ZeRO splits nothing: trade tensor or pipeline ranks for data ones (and that
    works: the exercise's answer does it); once every device holds a 1/N share, make room elsewhere; before that,
    the ZeRO stage that splits the largest part."""
    model, cluster, batch, _ = planner.PUZZLES["13B on 16 T4s"]
    for t, p in ((8, 2), (4, 4), (2, 8), (1, 16)):  # every way to fill 16 devices with tensor and pipeline ranks
        alone = planner.why_not(model, planner.Layout(1, t, p, micro_batches=64, recompute="full"), cluster)
        assert "here there is one: trade some tensor or pipeline ranks for data or context ranks, with ZeRO-1" in alone
    assert planner.judge("13B on 16 T4s", planner.Layout(4, 2, 2, zero=3, micro_batches=16, recompute="full")) == ""
    spread = planner.why_not(model, planner.Layout(16, 1, 1, zero=3, micro_batches=4, recompute="full"), cluster)
    assert "the largest part is optimizer" in spread and "it is split over all 16 devices already" in spread
    first = planner.why_not(model, planner.Layout(16, 1, 1, zero=0, micro_batches=4, recompute="full"), cluster)
    assert "ZeRO-1 or more splits it over the 16 data-parallel devices" in first
    crowded = planner.why_not(model, planner.Layout(2, 2, 4, micro_batch=16, micro_batches=2), cluster)
    assert "smaller micro-batch" not in crowded and "with 2 micro-batches on 4 stages" in crowded


def test_overlap_hides_each_axis_behind_the_compute_once():
    """Each axis's hidden share comes out of the stage's compute, in OVERLAP_AXES order, until it is used up; the
    compute and the bubble stay; nothing overlaps unless asked."""
    run = planner.PUBLISHED["Llama 3 405B on 8,192 H100s, 8K context"]
    plain = run.predict()
    assert plain.time == run.predict(overlap={}).time
    half = run.predict(overlap={"data": 0.5})
    assert half.time["data"] == pytest.approx(plain.time["data"] / 2)
    assert {k: v for k, v in half.time.items() if k != "data"} == {k: v for k, v in plain.time.items() if k != "data"}
    everything = run.predict(overlap=dict.fromkeys(planner.OVERLAP_AXES, 1.0))
    hidden = sum(plain.time[a] - everything.time[a] for a in planner.OVERLAP_AXES)
    communication = sum(plain.time[a] for a in planner.OVERLAP_AXES)
    assert hidden == pytest.approx(min(communication, plain.time["compute"]))
    assert everything.time["compute"] == plain.time["compute"] and everything.time["bubble"] == plain.time["bubble"]
    assert everything.seconds == pytest.approx(plain.seconds - hidden)
    with pytest.raises(ValueError, match="overlap axis='bubble'"):
        run.predict(overlap={"bubble": 1.0})
    with pytest.raises(ValueError, match=r"overlap\['data'\]=1.5"):
        run.predict(overlap={"data": 1.5})


def test_overlap_moves_the_published_runs_toward_their_reported_mfu():
    """Lesson 17's runs hide most of their communication; the planner without overlap predicts less than they
    reached, and with every axis hidden it predicts more, still at most what they reported."""
    for run in planner.PUBLISHED.values():
        plain, hidden = run.predict(), run.predict(overlap=dict.fromkeys(planner.OVERLAP_AXES, 1.0))
        assert plain.mfu < hidden.mfu <= run.mfu
