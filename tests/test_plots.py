"""Tests for memlib.viz.plots: the Chapter 1 stacked bars show what is live at the peak."""
import pytest

from memlib.core.estimate import estimate_training
from memlib.viz.plots import peak_composition, training_breakdown_figure

SETTINGS = [dict(precision="fp32"), dict(precision="bf16-mixed"),
            dict(precision="bf16-mixed", zero_stage=3, num_gpus=8, framework="deepspeed"),
            dict(precision="bf16-mixed", optimizer="adamw-8bit"),
            dict(precision="bf16-mixed", zero_stage=3, num_gpus=8, framework="fsdp2"),
            dict(precision="bf16-mixed", zero_stage=1, num_gpus=8, framework="megatron")]


@pytest.mark.parametrize("setting", SETTINGS)
def test_peak_composition_adds_up_to_the_peak(setting):
    est = estimate_training("llama-2-7b", batch_size=1, seq_len=4096, **setting)
    parts = peak_composition(est)
    assert sum(parts.values()) == est.total_bytes
    assert all(v >= 0 for v in parts.values())


def test_optimizer_peak_has_no_activations_and_backward_peak_no_gradients():
    fp32 = estimate_training("llama-2-7b", batch_size=1, seq_len=4096, precision="fp32")
    assert fp32.peak_phase == "optimizer"
    parts = peak_composition(fp32)
    assert parts["activations"] == 0 and parts["grads"] == fp32.grads_bytes
    # batch 4: the saved activations outweigh PyTorch AMP's 20 B/param optimizer step (at batch 1 the step peaks)
    mixed = estimate_training("llama-2-7b", batch_size=4, seq_len=4096, precision="bf16-mixed")
    assert mixed.peak_phase == "backward"
    parts = peak_composition(mixed)
    assert parts["grads"] == 0 and parts["activations"] == mixed.activations_bytes


def test_states_only_estimate():
    est = estimate_training(params=7 * 10**9)
    assert peak_composition(est)["activations"] == 0
    assert sum(peak_composition(est).values()) == est.total_bytes


def test_bar_heights_equal_the_printed_peaks():
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ests = [estimate_training("llama-2-7b", batch_size=1, seq_len=4096, **s) for s in SETTINGS]
    fig = training_breakdown_figure(ests, [str(i) for i in range(len(ests))])
    ax = fig.axes[0]
    tops = [0.0] * len(ests)
    for patch in ax.patches:
        i = round(patch.get_x() + patch.get_width() / 2)
        tops[i] = max(tops[i], patch.get_y() + patch.get_height())
    assert tops == pytest.approx([e.total_bytes / 1e9 for e in ests])
    plt.close(fig)
