"""Resident memory sampled while something runs, for the e2e tests that prove a transfer
streams (the broker's image copy, the routers' object transfers)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class RSSSampler:
    """Peak resident memory, sampled every `interval` seconds in a thread while the block
    runs: of process `pid`, or of whatever `measure` returns (a process group's total, e.g. a
    lab process's ``Record.rss``). ``start``, ``peak`` and ``end`` in bytes."""

    def __init__(
        self,
        pid: int | None = None,
        interval: float = 0.02,
        measure: Callable[[], int] | None = None,
    ) -> None:
        if measure is None:
            import psutil

            process = psutil.Process(pid)
            measure = lambda: int(process.memory_info().rss)  # noqa: E731
        self.measure = measure
        self.interval = interval
        self.peak = self.start = self.end = measure()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.measure())
            self._stop.wait(self.interval)

    def __enter__(self) -> RSSSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.end = self.measure()
        self.peak = max(self.peak, self.end)

    def describe(self) -> str:
        mb = 2**20
        return f"{self.start / mb:.0f} MB -> peak {self.peak / mb:.0f} MB -> {self.end / mb:.0f} MB"
