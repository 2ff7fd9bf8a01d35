"""FedDistill's settings (``feddistill.*``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from fedapp.sections import Section, at_least, setting


@dataclass(frozen=True)
class FedDistillSettings(Section):
    name = "feddistill"
    former_keys: ClassVar[Mapping[str, str]] = {
        "feddistill-weight": "kd-weight",
        "feddistill-exclude-own": "exclude-own",
    }

    #: lambda of the MSE to the label's global logit.
    kd_weight: float = setting(at_least(0))
    #: Each client gets the other clients' mean (Jeong et al.) instead of everyone's.
    exclude_own: bool = setting()
