"""The model: a Llama-style decoder (RMSNorm, SwiGLU, RoPE, GQA, document-masked attention) and its loss.

It owns the modules and the forward pass, and nothing about how they are split or stepped. It may import
trainer.config and nothing else of the project, so that evaluation, export and the planner can build a model
without the loop.
"""
