"""How the model is spread over devices and in what precision it computes: the process group and the DeepSpeed
engine (ZeRO stages, the gated update), DeepSpeed Ulysses sequence parallelism, the pipeline's stages (1F1B),
AutoTP tensor parallelism, and the choice of bf16 or fp32 from the hardware.

It may import trainer.config, trainer.optim and trainer.model; never the loop, checkpoints or health checks,
which build on it.
"""
