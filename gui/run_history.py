"""The Training tab's runs as the project keeps them (gui.history): earlier runs' loss, the latest run's fields."""
from __future__ import annotations

import time

from PySide6.QtWidgets import QCheckBox

from gui.history import MAX_RUNS, earlier_run
from gui.plots import TrainingPlots


class RunHistory:
    """Earlier runs (their loss curves, overlaid faintly when ``earlier_check`` is on) and the latest run's
    fields besides its plots: ``{"started", "recall", "summary", "status", "speed"}``, or None.

    Args:
        plots: the tab's plots (their snapshot is the latest run's series).
    """

    def __init__(self, plots: TrainingPlots) -> None:
        self.plots = plots
        self.earlier: list[dict] = []
        self.run: dict | None = None
        self.earlier_check = QCheckBox("Show earlier runs")
        self.earlier_check.setToolTip("Draw the loss of this project's earlier runs faintly behind the latest one")
        self.earlier_check.toggled.connect(plots.show_earlier_runs)
        self.earlier_check.setEnabled(False)

    def new_run(self) -> None:
        """A new run starts: the latest one becomes an earlier run (its loss curve is kept)."""
        if self.run is not None and self.plots.loss.x:  # a run that never took a step is not kept
            self.earlier.append(earlier_run({**self.run, **self.plots.snapshot()}))
            self.earlier = self.earlier[-(MAX_RUNS - 1):]  # what the project keeps (gui.history)
        self.run = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "recall": [], "summary": [], "status": "",
                    "speed": ""}
        self.set_earlier_curves()

    def restore(self, runs: list[dict]) -> dict | None:
        """A project's saved runs: the earlier ones kept for the overlay; returns the latest saved run (its
        recall rows and summary lines are recorded again as the tab shows them), or None."""
        self.earlier = [earlier_run(r) for r in runs[:-1]]
        self.run = None
        if runs:
            run = runs[-1]
            self.run = {"started": run.get("started", ""), "recall": [], "summary": [],
                        "status": run.get("status", ""), "speed": run.get("speed", "")}
        self.set_earlier_curves()
        return runs[-1] if runs else None

    def set_earlier_curves(self) -> None:
        curves = [r["series"]["loss"] for r in self.earlier if r["series"]["loss"][0]]
        self.plots.set_earlier_runs(curves)
        self.earlier_check.setEnabled(bool(curves))
        self.earlier_check.setText(f"Show earlier runs ({len(curves)})" if curves else "Show earlier runs")

    def record(self, key: str, items: list) -> None:
        """Append to the latest run's "recall" rows or "summary" lines (nothing when no run is kept)."""
        if self.run is not None:
            self.run[key].extend(items)

    def saved_runs(self) -> list[dict]:
        """The runs as gui.history saves them: the earlier ones, then the latest with its plots."""
        runs = list(self.earlier)
        if self.run is not None:
            runs.append({**self.run, **self.plots.snapshot()})
        return runs
