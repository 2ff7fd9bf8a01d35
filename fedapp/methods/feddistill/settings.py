"""FedDistill's settings (``feddistill.*``)."""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.sections import Section, at_least, setting


@dataclass(frozen=True)
class FedDistillSettings(Section):
    name = "feddistill"

    #: lambda of the MSE to the label's global logit.
    kd_weight: float = setting(at_least(0))
    #: Each client gets the other clients' mean (Jeong et al.) instead of everyone's.
    exclude_own: bool = setting()
