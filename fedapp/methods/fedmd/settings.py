"""FedMD's settings (``fedmd.*``): transfer learning, then per round an alignment subset's
consensus to digest and the private shard to revisit."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedapp.sections import Section, at_least, setting


@dataclass(frozen=True)
class FedMDSettings(Section):
    name = "fedmd"

    alignment_size: int = setting(at_least(1))
    pretrain_public_epochs: int = setting(at_least(0))
    pretrain_private_epochs: int = setting(at_least(0))
    digest_epochs: int = setting(at_least(1))
    revisit_epochs: int = setting(at_least(0))

    def cross_checks(self, strategy: str, run: Mapping[str, Any]) -> list[str]:
        if self.alignment_size > run["public-size"]:
            return [
                f"'fedmd.alignment-size' = {self.alignment_size} is larger than 'public-size' = "
                f"{run['public-size']}: FedMD draws its alignment subsets from the public set, "
                "so allowed is 1 to public-size"
            ]
        return []
