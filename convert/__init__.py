"""Host-side converters (torch allowed): GPT → GGUF, encoder → ONNX (+int8), router → ONNX, bundle.

Each converter checks its export against the torch original and writes a parity report beside it.
The device runtime (``edge_rag``) never imports this package.
"""
import edge_rag  # noqa: F401  first: onnxruntime then loads with its usage events off (edge_rag/__init__.py)
