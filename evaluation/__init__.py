"""Evaluation tooling shared by the host side (router labelling in ``convert``) and ``benchmarks``:
QA dataset readers and answer metrics. Not part of the device runtime: ``edge_rag`` never imports it."""
