"""The cost arithmetic before a run: model shapes, parameter and FLOP counts, memory per GPU (weights, optimizer,
activations with recomputation, TP, SP and 1F1B), layouts that fit, and Young's checkpoint interval.

It may import trainer.config and nothing else of the project: `pretrain plan` runs it without torch's
distributed machinery.
"""
