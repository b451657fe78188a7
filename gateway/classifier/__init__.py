"""Prompt difficulty classifier: tokenizer, ONNX encoder, micro-batcher, labels, training, export."""
