"""A corpus of NeMo-RL-shaped runs: NeMo-RL's own config loading, Logger (W&B offline, TensorBoard, MLflow SQLite)
and CheckpointManager, imported from a NeMo-RL source tree at generation time, around real TRL training of a tiny
local model on CPU. See README.md."""
