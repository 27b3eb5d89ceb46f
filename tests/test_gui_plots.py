"""Issue 24: plots that scale with the model. Per-layer gradient norms of more than eight layers (SmolLM2
has 30 blocks) are a layer x step heat map with a colour bar, eight or fewer are lines; legends sit
outside the data, so no curve and no label ("tuning starts") is ever under one."""
from __future__ import annotations

import math

import numpy as np
import pytest

from gui.events import TrainingStep
from gui.plots import HEATMAP_LAYERS, TrainingPlots


def _feed(plots: TrainingPlots, norms: np.ndarray, tune_from: int | None = None) -> None:
    """One TrainingStep per row of ``norms`` (steps, layers), global steps 1, 2, ..."""
    for i, row in enumerate(norms, start=1):
        stage = "dialogues" if tune_from and i > tune_from else "pretrain"
        plots.add_step(TrainingStep(stage=stage, step=i, total_steps=len(norms), global_step=i, loss=4.0 / i,
                                    grad_norm=float(np.nansum(row)), lr=1e-3, layer_grad_norms=tuple(map(float, row))))
    plots.flush()


@pytest.fixture
def plots(qtbot):
    p = TrainingPlots()
    qtbot.addWidget(p)
    p.resize(1200, 560)
    p.show()
    qtbot.waitExposed(p)
    yield p
    p.stop()


def test_the_layers_of_a_30_layer_model_are_a_heat_map(plots, qtbot):
    """30 blocks + embedding + output: one image row per layer, one column per step, the colour the
    log10 of the norm (the colour bar spans them); a non-finite norm is a gap, not a colour. A saved
    run shown again is the same map."""
    rng = np.random.default_rng(0)
    norms = rng.uniform(0.01, 5.0, (40, 32))
    norms[7, 3] = math.nan  # a skipped step's norm: not drawn
    _feed(plots, norms)
    assert plots.is_heat_map() and plots.layer_stack.currentWidget() is plots.layer_map
    assert plots.layer_curves == [] and not plots.layer_plot.getPlotItem().listDataItems()
    image = plots.layer_image.image
    assert image.shape == (32, 40)  # (layer, step)
    want = np.log10(norms.T)
    assert np.isnan(image[3, 7]) and np.allclose(image[np.isfinite(want)], want[np.isfinite(want)])
    lo, hi = plots.layer_bar.levels()
    assert lo == pytest.approx(np.nanmin(want)) and hi == pytest.approx(np.nanmax(want))
    rect = plots.layer_image.mapRectToParent(plots.layer_image.boundingRect())
    assert (rect.left(), rect.right(), rect.top(), rect.bottom()) == pytest.approx((0.5, 40.5, 0.0, 32.0))
    names = [s for s_ in plots.layer_map.getPlotItem().getAxis("left")._tickLevels[0] for s in s_[1:]]
    assert names[0] == "embedding" and names[-1] == "output" and len(names) >= 4

    plots.add_stage_marker(20.5, "tuning starts")  # drawn across the map too
    assert [m.value() for m in plots.layer_map.getPlotItem().items if hasattr(m, "angle")] == [20.5]
    run = plots.snapshot()
    plots.clear()
    assert not [m for m in plots.layer_map.getPlotItem().items if hasattr(m, "angle")]
    assert not plots.is_heat_map() and plots.layer_stack.currentWidget() is plots.layer_plot
    plots.restore(run)
    assert plots.is_heat_map() and np.array_equal(plots.layer_image.image, image, equal_nan=True)
    assert [m.value() for m in plots.layer_map.getPlotItem().items if hasattr(m, "angle")] == [20.5]


@pytest.mark.parametrize("n", [3, HEATMAP_LAYERS])
def test_a_few_layers_are_lines_with_a_legend(plots, n):
    norms = np.random.default_rng(1).uniform(0.1, 2.0, (20, n))
    _feed(plots, norms)
    assert not plots.is_heat_map() and plots.layer_stack.currentWidget() is plots.layer_plot
    assert len(plots.layer_curves) == n
    assert list(plots.layer_curves[-1].getData()[1]) == pytest.approx(norms[:, -1])
    legend = plots.layer_plot.getPlotItem().legend
    assert [label.text for _sample, label in legend.items] == ["embedding", *[f"block {i}" for i in range(n - 2)],
                                                                "output"]


def test_legends_cover_no_data_and_no_label(plots, qtbot):
    """Each legend lies outside its plot's data area; the "tuning starts" label lies inside the loss
    plot's data area, under no legend (issue 24: it sat under the loss legend)."""
    _feed(plots, np.random.default_rng(2).uniform(0.1, 2.0, (300, 4)), tune_from=150)
    plots.add_stage_marker(150.5, "tuning starts")
    qtbot.wait(100)
    legends = []
    for plot in (plots.loss_plot, plots.grad_plot, plots.layer_plot):
        item = plot.getPlotItem()
        view = item.getViewBox().sceneBoundingRect()
        legend = item.legend.sceneBoundingRect()
        assert legend.height() > 0 and not legend.intersects(view), item.titleLabel.text
        legends.append(legend)
    label = plots._markers[0].label
    assert label.toPlainText() == "tuning starts"
    box = label.sceneBoundingRect()
    assert plots.loss_plot.getPlotItem().getViewBox().sceneBoundingRect().contains(box)
    assert not any(box.intersects(legend) for legend in legends)
