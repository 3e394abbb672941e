"""GSM8K-style evaluation (`rlstack eval`), offline re-scoring and paired comparison. See evaluate.gsm8k."""
