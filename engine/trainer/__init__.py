"""The training library's loop and what it needs around it:

- loop: `train`, the ES / LBES loop read top to bottom (CleanRL-style)
- es_step, lbes_step: one step of each method
- evaluation: the eval set, greedy, as the eval strategy asks
- checkpoints: saving and loading what an exact resume needs, and the final model
- reporting: the metrics, population rows and samples a step hands to the Sink
- preflight: checks before a run is stored or started, and the loop's setup
"""

from engine.trainer.checkpoints import list_checkpoints
from engine.trainer.loop import TrainingStopped, train
from engine.trainer.preflight import plan_total_steps, start_pool

__all__ = ["TrainingStopped", "list_checkpoints", "plan_total_steps", "start_pool", "train"]
