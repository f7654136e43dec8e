"""Model integration: quantize a whole model in one format (:mod:`.quantize`), rounded to nearest or
calibrated with GPTQ (:mod:`.calibrate`, :mod:`.gptq`, :mod:`.calibration_data`), save and load it with
its integrity checks, and install other tools' NVFP4 checkpoints (:mod:`.checkpoint`)."""

from .checkpoint import LoadError, load_nvfp4_checkpoint, load_quantized, save_quantized
from .calibrate import CalibrationInfo, GptqOptions, gptq_recipe
from .quantize import QuantizePlan, QuantizeReport, model_bytes, plan_quantization, quantize_model

__all__ = ["CalibrationInfo", "GptqOptions", "gptq_recipe", "LoadError", "QuantizeReport", "load_nvfp4_checkpoint", "load_quantized",
           "model_bytes", "plan_quantization", "QuantizePlan", "quantize_model", "save_quantized"]
