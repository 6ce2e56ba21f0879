"""Serving-engine placement files: write a Placement the way each engine loads it.

One module per engine, each registering an :class:`EngineFormat`:

=============  ==========================================  ===========================
name           file                                        layer axis
=============  ==========================================  ===========================
``sglang``     JSON ``{"physical_to_logical_map": ...}``   every hidden layer
``trtllm``     MoE load-balancer YAML                      absolute MoE layer ids
``vllm``       JSON ``[[P ids] per MoE layer]`` (exp.)     MoE-layer position
``vllm-ascend`` JSON ``{"moe_layer_count", "layer_list"}``  MoE-layer position
``eplb``       ``.npz`` ``phy2log``/``log2phy``/``logcnt``   MoE-layer position
=============  ==========================================  ===========================

Entry points: :func:`write_engine` (:func:`export_engine` also says what was written),
:func:`read_engine`, :func:`engine_names`, :func:`sniff_engine`.
"""

# Built-in formats register themselves on import.
from placer.engines import eplb_npz, sglang, trtllm, vllm, vllm_ascend
from placer.engines.registry import (
    EngineExport,
    EngineFormat,
    EngineModel,
    engine_names,
    export_engine,
    get_engine,
    read_engine,
    register_engine,
    sniff_engine,
    write_engine,
)

__all__ = [
    "EngineExport",
    "EngineFormat",
    "EngineModel",
    "engine_names",
    "eplb_npz",
    "export_engine",
    "get_engine",
    "read_engine",
    "register_engine",
    "sglang",
    "sniff_engine",
    "trtllm",
    "vllm",
    "vllm_ascend",
    "write_engine",
]
