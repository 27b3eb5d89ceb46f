"""Live training plots (pyqtgraph): loss with validation points, gradient norm with clip events,
per-layer gradient norms, learning rate.

Incoming numbers are appended to lists; a QTimer pushes them to the curves at most ``fps`` times a
second, whatever the step rate. Non-finite values are never drawn: a skipped step (NaN/inf loss) is
marked with a red cross on the loss plot instead. Legends sit below their plot, outside the data, so
that they cover no curve and no label (such as "tuning starts"). Per-layer norms of more than
``HEATMAP_LAYERS`` layers (SmolLM2 has 30 blocks) are a layer x step heat map with a colour bar: that many
lines would only overlap.
"""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, QTimer
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QGridLayout, QStackedWidget, QWidget

from gui.events import TrainingStep, ValidationLoss

pg.setConfigOptions(antialias=True, background="w", foreground="k")

HEATMAP_LAYERS = 8
"""Up to this many rows of per-layer norms are lines; more are a heat map."""
LEGEND_COLUMNS = 4


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def _plot(title: str, y_label: str, legend: bool = True) -> pg.PlotWidget:
    w = pg.PlotWidget(title=title)
    item = w.getPlotItem()
    item.showGrid(x=True, y=True, alpha=0.25)
    item.setLabel("bottom", "step")
    if y_label:
        item.setLabel("left", y_label)
    item.setClipToView(True)
    item.setDownsampling(auto=True, mode="peak")
    if legend:
        # below the "step" axis (row 4 of the PlotItem's layout), not anchored in the view box: curves
        # added with a name still join it (PlotItem.addItem uses ``item.legend``)
        item.legend = pg.LegendItem(offset=None, colCount=LEGEND_COLUMNS, frame=False)
        item.layout.addItem(item.legend, 4, 1)
    return w


def _heat_map(title: str) -> tuple[pg.PlotWidget, pg.ImageItem, pg.ColorBarItem]:
    """A plot of a (layer, step) image with a colour bar at its right."""
    w = pg.PlotWidget(title=title)
    item = w.getPlotItem()
    item.setLabel("bottom", "step")
    item.setLabel("left", "layer")
    item.getAxis("left").setStyle(textFillLimits=[(0, 0.9), (2, 0.9), (4, 0.8), (6, 0.7)])  # every name given
    image = pg.ImageItem(axisOrder="row-major")
    item.addItem(image)
    bar = pg.ColorBarItem(colorMap=pg.colormap.get("viridis"), label="log10 of the L2 norm", interactive=False,
                          width=15)
    bar.setImageItem(image, insert_in=item)
    return w, image, bar


class _Series:
    """x/y lists of one curve (only finite points)."""

    def __init__(self) -> None:
        self.x: list[float] = []
        self.y: list[float] = []

    def add(self, x: float, y) -> bool:
        if _finite(y):
            self.x.append(float(x))
            self.y.append(float(y))
            return True
        return False

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.x, dtype=float), np.asarray(self.y, dtype=float)


class TrainingPlots(QWidget):
    """Four plots in a grid, fed with :meth:`add_step` / :meth:`add_validation` events."""

    def __init__(self, parent: QWidget | None = None, fps: int = 10) -> None:
        super().__init__(parent)
        self.loss_plot = _plot("Training loss", "nats / token")
        self.grad_plot = _plot("Global gradient norm (before clipping)", "L2 norm")
        self.layer_plot = _plot("Gradient norm per layer", "L2 norm")
        self.layer_map, self.layer_image, self.layer_bar = _heat_map("Gradient norm per layer")
        self.layer_stack = QStackedWidget()  # lines, or the heat map of more than HEATMAP_LAYERS layers
        self.layer_stack.addWidget(self.layer_plot)
        self.layer_stack.addWidget(self.layer_map)
        # one curve, named by the title: a legend box would only cover it (a constant lr, or the tuning
        # stage's warmup peak, runs along the top right); tick labels such as 2.5e-05 need the room
        self.lr_plot = _plot("Learning rate", "", legend=False)
        # pyqtgraph's SI prefix turns lr 0.5 into "500 (x0.001)": plain numbers read right at any size
        self.lr_plot.getPlotItem().getAxis("left").enableAutoSIPrefix(False)
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.addWidget(self.loss_plot, 0, 0)
        grid.addWidget(self.grad_plot, 0, 1)
        grid.addWidget(self.layer_stack, 1, 0)
        grid.addWidget(self.lr_plot, 1, 1)

        self.loss_curve = self.loss_plot.plot(pen=pg.mkPen("#1f77b4", width=1.5), name="training")
        self.val_scatter = {
            "facts": self._marks(self.loss_plot, "o", 9, "#ff7f0e", "validation (facts)"),
            "dialogues": self._marks(self.loss_plot, "s", 9, "#2ca02c", "validation (dialogues)"),
        }
        self.skip_scatter = self._marks(self.loss_plot, "x", 12, "#d62728", "skipped (not finite)")
        self.grad_curve = self.grad_plot.plot(pen=pg.mkPen("#9467bd", width=1.5), name="norm")
        self.clip_scatter = self._marks(self.grad_plot, "t", 8, "#d62728", "clipped")
        self.clip_line = pg.InfiniteLine(angle=0, movable=False,
                                         pen=pg.mkPen("#d62728", style=pg.QtCore.Qt.PenStyle.DashLine))
        self.clip_line.setVisible(False)
        self.grad_plot.addItem(self.clip_line)
        self.lr_curve = self.lr_plot.plot(pen=pg.mkPen("#17becf", width=1.5))
        self.layer_curves: list[pg.PlotDataItem] = []
        self.layer_names: list[str] = []
        self._markers: list[pg.InfiniteLine] = []
        self._marker_lines: list[tuple[pg.PlotWidget, pg.InfiniteLine]] = []  # the markers on the layer plots
        self._marker_data: list[list] = []  # [step, label] of each marker (saved with the project)
        self.earlier_curves: list[pg.PlotDataItem] = []  # earlier runs' loss, drawn faintly when shown
        self._show_earlier = False
        self._clip_threshold = 0.0

        self._timer = QTimer(self, interval=max(1, 1000 // fps))
        self._timer.timeout.connect(self.flush)
        self._timer.start()
        self.clear()

    @staticmethod
    def _marks(plot: pg.PlotWidget, symbol: str, size: int, color: str, name: str) -> pg.PlotDataItem:
        """Markers without a connecting line."""
        return plot.plot([], [], pen=None, symbol=symbol, symbolSize=size, symbolBrush=color,
                         symbolPen=color, name=name)

    # ----------------------------------------------------------------------------- data
    def clear(self) -> None:
        """Forget every point (a new run)."""
        self.loss = _Series()
        self.grad = _Series()
        self.clip = _Series()
        self.lr = _Series()
        self.skipped = _Series()
        self.val = {k: _Series() for k in self.val_scatter}
        self.layers: list[_Series] = []
        for c in self.layer_curves:
            self.layer_plot.removeItem(c)
        self.layer_curves = []
        self.layer_image.clear()
        self.layer_stack.setCurrentWidget(self.layer_plot)
        legend = self.layer_plot.getPlotItem().legend
        if legend is not None:
            legend.clear()
        for m in self._markers:
            self.loss_plot.removeItem(m)
        for plot, m in self._marker_lines:
            plot.removeItem(m)
        self._markers = []
        self._marker_lines = []
        self._marker_data = []
        self._last_loss = None
        self._dirty = True

    def set_clip_threshold(self, value: float) -> None:
        self._clip_threshold = float(value) if _finite(value) else 0.0
        self.clip_line.setVisible(value > 0)
        if value > 0:
            self.clip_line.setValue(value)

    def add_step(self, d: TrainingStep) -> None:
        """Append one step's numbers."""
        x = d.global_step
        if self.loss.add(x, d.loss):
            self._last_loss = d.loss
        if d.skipped or not _finite(d.loss):
            self.skipped.add(x, self._last_loss if self._last_loss is not None else 0.0)
        self.grad.add(x, d.grad_norm)
        if d.clipped and _finite(d.grad_norm):
            self.clip.add(x, d.grad_norm)
        self.lr.add(x, d.lr)
        norms = d.layer_grad_norms or ()
        if len(norms) != len(self.layers):
            self._make_layer_curves(len(norms))
        for s, v in zip(self.layers, norms):
            s.add(x, v)
        self._dirty = True

    def add_validation(self, d: ValidationLoss) -> None:
        """Append the validation losses of one step (a kind the dataset lacks is None: not drawn)."""
        self.val["facts"].add(d.global_step, d.facts)
        self.val["dialogues"].add(d.global_step, d.dialogues)
        self._dirty = True

    def add_stage_marker(self, x: float, label: str) -> None:
        line = pg.InfiniteLine(pos=x, angle=90, movable=False, pen=pg.mkPen("#888", style=pg.QtCore.Qt.PenStyle.DotLine),
                               label=label, labelOpts={"position": 0.9, "color": "#555"})
        self.loss_plot.addItem(line)
        self._markers.append(line)
        self._marker_data.append([x, label])
        # the same step on the per-layer plots, unlabelled (the loss plot names it)
        for plot, color in ((self.layer_plot, "#888"), (self.layer_map, "w")):
            other = pg.InfiniteLine(pos=x, angle=90, movable=False,
                                    pen=pg.mkPen(color, style=pg.QtCore.Qt.PenStyle.DotLine))
            plot.addItem(other)
            self._marker_lines.append((plot, other))

    def _make_layer_curves(self, n: int) -> None:
        """Series for ``n`` layers' norms: a line each, or a row each of the heat map (more than
        ``HEATMAP_LAYERS``), its rows named on the left axis."""
        for c in self.layer_curves:
            self.layer_plot.removeItem(c)
        legend = self.layer_plot.getPlotItem().legend
        if legend is not None:
            legend.clear()
        names = ["embedding"] + [f"block {i}" for i in range(n - 2)] + ["output"] if n >= 2 else ["all"] * n
        self.layers = [_Series() for _ in range(n)]
        self.layer_names = names
        heat = self.is_heat_map()
        self.layer_stack.setCurrentWidget(self.layer_map if heat else self.layer_plot)
        self.layer_curves = [] if heat else [
            self.layer_plot.plot(pen=pg.mkPen(pg.intColor(i, max(n, 1)), width=1.2), name=names[i]) for i in range(n)]
        if heat:
            every = -(-n // 5)  # five names or so fit a small plot; the others get a tick
            named = {0, n - 1, *range(every, n - 1 - every // 2, every)}
            axis = self.layer_map.getPlotItem().getAxis("left")
            axis.setTicks([[(i + 0.5, names[i]) for i in sorted(named)],
                           [(i + 0.5, "") for i in range(n) if i not in named]])
            # wide enough for every name at once (a name wider than the axis is not drawn)
            axis.setWidth(QFontMetrics(axis.font()).horizontalAdvance(max(names, key=len)) + 40)
            self.layer_image.clear()

    def is_heat_map(self) -> bool:
        """True when the per-layer norms are drawn as a layer x step heat map (more than ``HEATMAP_LAYERS``)."""
        return len(self.layers) > HEATMAP_LAYERS

    def _flush_heat_map(self) -> None:
        """The per-layer norms as an image of (layer, step), log10 of the norm (they span decades), a
        step without a finite norm transparent."""
        xs = np.unique(np.concatenate([np.asarray(s.x, dtype=float) for s in self.layers]))
        if not len(xs):
            return
        rows = np.full((len(self.layers), len(xs)), np.nan)
        for i, s in enumerate(self.layers):
            x, y = s.arrays()
            rows[i, np.searchsorted(xs, x)] = np.where(y > 0, np.log10(np.maximum(y, 1e-30)), np.nan)
        finite = rows[np.isfinite(rows)]
        if not finite.size:
            return
        lo, hi = float(finite.min()), float(finite.max())
        self.layer_image.setImage(rows, autoLevels=False)
        self.layer_image.setRect(QRectF(xs[0] - 0.5, 0.0, max(xs[-1] - xs[0], 0.0) + 1.0, float(len(self.layers))))
        self.layer_bar.setLevels((lo, hi if hi > lo else lo + 1e-3))

    # ----------------------------------------------------------------------------- saved runs
    def snapshot(self) -> dict:
        """The plotted numbers as plain lists (gui.history's run fields ``series``, ``layers``,
        ``markers``, ``clip_threshold``); only finite points, as drawn."""
        series = {"loss": self.loss, "grad": self.grad, "clip": self.clip, "lr": self.lr, "skipped": self.skipped,
                  "val_facts": self.val["facts"], "val_dialogues": self.val["dialogues"]}
        return {"series": {k: [list(s.x), list(s.y)] for k, s in series.items()},
                "layers": [[list(s.x), list(s.y)] for s in self.layers],
                "markers": [list(m) for m in self._marker_data], "clip_threshold": self._clip_threshold}

    def restore(self, run: dict) -> None:
        """Show a saved run (what :meth:`snapshot` returned, read back by gui.history); later steps of a
        resumed run are appended to it."""
        self.clear()
        targets = {"loss": self.loss, "grad": self.grad, "clip": self.clip, "lr": self.lr, "skipped": self.skipped,
                   "val_facts": self.val["facts"], "val_dialogues": self.val["dialogues"]}
        for name, (xs, ys) in run.get("series", {}).items():
            if name in targets:
                for x, y in zip(xs, ys):
                    targets[name].add(x, y)
        layers = run.get("layers", [])
        if layers:
            self._make_layer_curves(len(layers))
            for s, (xs, ys) in zip(self.layers, layers):
                for x, y in zip(xs, ys):
                    s.add(x, y)
        for x, label in run.get("markers", []):
            self.add_stage_marker(x, label)
        self.set_clip_threshold(run.get("clip_threshold", 0.0))
        self._last_loss = self.loss.y[-1] if self.loss.y else None
        self._dirty = True
        self.flush()

    def set_earlier_runs(self, runs: list[tuple[list[float], list[float]]]) -> None:
        """The loss curves ``(steps, losses)`` of the project's earlier runs, oldest first: drawn
        faintly behind the current run while :meth:`show_earlier_runs` is on."""
        for c in self.earlier_curves:
            self.loss_plot.removeItem(c)
        self.earlier_curves = []
        n = len(runs)
        for i, (xs, ys) in enumerate(runs):
            alpha = 60 + int(80 * (i + 1) / n)  # the more recent, the less faint
            c = pg.PlotDataItem(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float),
                                pen=pg.mkPen(120, 120, 120, alpha, width=1.0))
            c.setZValue(-10)
            c.setVisible(self._show_earlier)
            self.earlier_curves.append(c)
            self.loss_plot.addItem(c)
        self._update_earlier_legend()

    def show_earlier_runs(self, on: bool) -> None:
        """Draw (True) or hide the earlier runs' loss curves."""
        self._show_earlier = bool(on)
        for c in self.earlier_curves:
            c.setVisible(self._show_earlier)
        self._update_earlier_legend()

    def earlier_runs_shown(self) -> int:
        """How many earlier runs' loss curves are drawn now (for tests)."""
        return sum(1 for c in self.earlier_curves if c.isVisible() and c.xData is not None and len(c.xData))

    def _update_earlier_legend(self) -> None:
        legend = self.loss_plot.getPlotItem().legend
        if legend is None or not self.earlier_curves:
            return
        legend.removeItem(self.earlier_curves[-1])
        if self._show_earlier:
            legend.addItem(self.earlier_curves[-1], "earlier runs")

    def point_count(self) -> int:
        """Points drawn in the loss curve (for tests)."""
        return len(self.loss_curve.xData) if self.loss_curve.xData is not None else 0

    # ----------------------------------------------------------------------------- drawing
    def flush(self) -> None:
        """Push new points to the curves (called by the timer)."""
        if not self._dirty:
            return
        self._dirty = False
        self.loss_curve.setData(*self.loss.arrays())
        self.grad_curve.setData(*self.grad.arrays())
        self.lr_curve.setData(*self.lr.arrays())
        self.clip_scatter.setData(*self.clip.arrays())
        self.skip_scatter.setData(*self.skipped.arrays())
        for key, s in self.val.items():
            self.val_scatter[key].setData(*s.arrays())
        if self.is_heat_map():
            self._flush_heat_map()
        for s, c in zip(self.layers, self.layer_curves):
            c.setData(*s.arrays())

    def stop(self) -> None:
        self._timer.stop()
