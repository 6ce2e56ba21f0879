"""The model: its MoE shapes and bytes (:mod:`placer.model.spec`), how one is found
(:mod:`placer.model.load`: presets, model YAML, Hugging Face ``config.json`` through
:mod:`placer.model.hf_config`), what fits in a GPU's memory (:mod:`placer.model.capacity`,
:mod:`placer.model.slots`) and the rows ``placer model`` / ``placer capacity`` print
(:mod:`placer.model.describe`)."""

from placer.model.load import load_model, model_from_dict, model_names
from placer.model.spec import DTYPES, ModelSpec, check_dtype, model_to_dict, spec_problems

__all__ = ["DTYPES", "ModelSpec", "check_dtype", "load_model", "model_from_dict", "model_names",
           "model_to_dict", "spec_problems"]
