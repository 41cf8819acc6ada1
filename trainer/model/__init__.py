"""The model: a Llama-style decoder (RMSNorm, SwiGLU, RoPE, GQA, document-masked attention) and its loss.

It owns the modules and the forward pass, and nothing about how they are split or stepped. It may import
trainer.base_config and nothing else of the project (its settings, ModelConfig and the parameter count, are in
config.py beside it), so that evaluation, export and the planner can build a model
without the loop.
"""
