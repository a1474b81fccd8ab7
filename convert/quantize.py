"""Int8 weight quantisation of an ONNX transformer, one scheme chosen by measurement across CPU kernels.

onnxruntime runs int8 MatMuls on different kernels per CPU (AVX-512-VNNI, AVX2, SSE4, ARM NEON/dot):
an int8 model that tracks torch closely on the build host may drift on the device. The schemes below
are measured by ``python -m convert kernels`` natively and under qemu CPU models against torch
(docs/decisions/int8-scheme.md). ``DEFAULT_SCHEME`` gives the same vectors on the AVX2-only path as on
AVX-512-VNNI, at half the fp32 query latency. Import ``quantize_int8`` for every MiniLM-style model.
"""
from __future__ import annotations

import re
from pathlib import Path

import onnx
from onnxruntime.quantization import QuantType, quantize_dynamic

# name → quantize_dynamic keyword arguments. Activations are quantised at run time (dynamic), weights
# once here; ``reduce_range`` keeps weights in 7 bits so AVX2's u8×s8 pair sums (vpmaddubsw) cannot
# saturate, the cause of the AVX2-only drift of the plain per-channel scheme.
SCHEMES: dict[str, dict] = {
    "qint8": {"weight_type": QuantType.QInt8, "per_channel": True},
    "qint8-reduce": {"weight_type": QuantType.QInt8, "per_channel": True, "reduce_range": True},
    "quint8": {"weight_type": QuantType.QUInt8, "per_channel": True},
    "quint8-reduce": {"weight_type": QuantType.QUInt8, "per_channel": True, "reduce_range": True},
    # The FFN down-projections see GELU outputs with heavy outliers: keep them in float.
    "qint8-reduce-ffn-fp32": {"weight_type": QuantType.QInt8, "per_channel": True, "reduce_range": True,
                              "exclude": r"/layer\.\d+/output/dense/MatMul$"},
}
DEFAULT_SCHEME = "qint8-reduce"


def quantize_int8(fp32: str | Path, out: str | Path, scheme: str = DEFAULT_SCHEME) -> Path:
    """Write the int8 version of the ONNX model ``fp32`` to ``out`` with the named scheme."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown int8 scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    options = dict(SCHEMES[scheme])
    pattern = options.pop("exclude", None)
    if pattern:
        graph = onnx.load(str(fp32), load_external_data=False).graph
        options["nodes_to_exclude"] = [n.name for n in graph.node if re.search(pattern, n.name)]
    quantize_dynamic(str(fp32), str(out), **options)
    return Path(out)
