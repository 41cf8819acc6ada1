"""The cost arithmetic before a run: model shapes, parameter and FLOP counts, memory per GPU (weights, optimizer,
activations with recomputation, TP, SP and 1F1B), layouts that fit, Young's checkpoint interval, and the scaling law
fitted to a ladder's losses (scaling_law.py: numpy and scipy, no torch).

It may import trainer.config and the parts' settings (trainer/model/config.py: the parameter count) and nothing
else of the project: `pretrain plan` runs it without torch's
distributed machinery.
"""
