"""What two runs of one experiment must share in summary.json: everything but what the machine
measured (wall times, resource use, the server's share of the fleet's time)."""

from __future__ import annotations

from typing import Any

#: Where a run's files went, whether it resumed, and its wall times.
VOLATILE = {"wall_seconds", "timing", "resumed_from_round", "run_dir"}
MEASURED_RESOURCES = {"cpu_percent_mean", "peak_rss_mb_mean", "peak_rss_mb_max"}
#: The fleet's totals add the server's measured work to the clients' fleet seconds.
MEASURED_FLEET = {"seconds", "hours"}


def comparable_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary without what was measured: the resources' measured means, the fleet's totals,
    the seconds of each device's work (its client-rounds stay)."""
    kept = {k: v for k, v in summary.items() if k not in VOLATILE}
    if "resources" in kept:
        kept["resources"] = {
            k: v for k, v in summary["resources"].items() if k not in MEASURED_RESOURCES
        }
    if "fleet" in kept:
        kept["fleet"] = {k: v for k, v in summary["fleet"].items() if k not in MEASURED_FLEET}
    if "work_by_device" in kept:
        kept["work_by_device"] = {
            device: work["client_rounds"] for device, work in summary["work_by_device"].items()
        }
    return kept
