"""Online GRPO, by job: `config.py` (the grpo section), `objective.py` (advantages, reward
shaping, the clipped token loss: pure tensors), `rollouts.py` (groups sampled on the train
tasks), `update.py` (the policy update on a step's rollouts), `train.py` (the online loop and
its model: `fit_grpo`). The `grpo` stage (pipelines/stages/grpo.py) runs it."""
