"""What every policy of a replay shares: the cluster, the model, the regime, the slots."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from placer.model import ModelSpec
from placer.regime import Regime
from placer.topology import Topology


@dataclass(frozen=True)
class Setting:
    """What every policy of a replay shares: the cluster, the model, the regime, the
    slots per GPU the engines' layout and EPLB use, the expert dtype."""

    topology: Topology
    model: ModelSpec
    regime: Regime
    slots_per_gpu: int
    dtype: str
    layer_ids: np.ndarray

    @property
    def num_gpus(self) -> int:
        return int(self.topology.num_gpus)
