"""Prompt difficulty classifier, serving side: tokenizer, ONNX encoder, micro-batcher, embedding caches, head.

Everything offline (labels, training, export, calibration, datasets) lives in gateway.training;
nothing here imports it.
"""
