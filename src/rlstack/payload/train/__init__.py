"""GRPO training (TRL's GRPOTrainer, use_vllm=False on the portable path). See train.grpo.run."""
