"""The progress of a run that another process executes, read from its run folder.

``fedapp compare`` starts each method with ``flwr run`` and would otherwise say nothing for the
minutes a method takes. The ServerApp appends one line per finished round to ``metrics.jsonl``, so
the folder alone tells how far a run is: a progress bar on a terminal, and a plain line every
``quiet_seconds`` where the output goes to a log.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from fedapp.evaluation.results import METRICS_FILE


def rounds_done(run_dir: Path) -> int:
    """Rounds the run's ``metrics.jsonl`` holds (0 before the first)."""
    try:
        with (run_dir / METRICS_FILE).open("rb") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class RunProgress:
    """Watches one run folder; call :meth:`update` every few seconds, :meth:`close` at the end.

    The estimate of the time left extrapolates the rounds finished while watching (a resumed
    run's earlier rounds took their time in another process)."""

    def __init__(
        self,
        run_dir: Path,
        total_rounds: int,
        *,
        out: TextIO = sys.stdout,
        quiet_seconds: float = 30.0,
    ) -> None:
        self.run_dir = run_dir
        self.total = total_rounds
        self.out = out
        self.quiet_seconds = quiet_seconds
        self.start_round = rounds_done(run_dir)
        self.done = self.start_round
        self.started = time.monotonic()
        self.last_line = self.started
        self.bar = (
            tqdm(
                total=total_rounds,
                initial=self.start_round,
                unit="round",
                file=out,
                leave=False,
                dynamic_ncols=True,
            )
            if out.isatty()
            else None
        )

    def status(self) -> str:
        """``round 12/100 | 3:20 elapsed | about 25:00 left`` (after the last round: the final
        evaluation)."""
        elapsed = time.monotonic() - self.started
        if self.done >= self.total:
            return f"rounds done, final evaluation | {_clock(elapsed)} elapsed"
        text = f"round {self.done}/{self.total} | {_clock(elapsed)} elapsed"
        new_rounds = self.done - self.start_round
        if new_rounds:
            left = elapsed / new_rounds * (self.total - self.done)
            text += f" | about {_clock(left)} left"
        return text

    def update(self) -> None:
        """Read the folder; move the bar, or print the status once ``quiet_seconds`` passed."""
        done = rounds_done(self.run_dir)
        now = time.monotonic()
        if done < self.start_round:  # a fresh run from round 1 replaced unfinished metrics
            self.start_round = 0
        if self.bar is not None:
            self.bar.update(done - self.done)
            self.done = done
            if done >= self.total:
                self.bar.set_postfix_str("final evaluation")
            self.bar.refresh()
            return
        self.done = done
        if now - self.last_line >= self.quiet_seconds:
            print(f"    {self.status()}", file=self.out, flush=True)
            self.last_line = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
