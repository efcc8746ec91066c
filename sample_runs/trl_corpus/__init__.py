"""A corpus of real Hugging Face TRL GRPO runs (``trl.GRPOTrainer`` on CPU, a tiny local model) logged through
TRL's own ``report_to`` callbacks to W&B (offline), MLflow (SQLite) and TensorBoard. See README.md."""
