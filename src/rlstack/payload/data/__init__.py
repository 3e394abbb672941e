"""Problems for training and evaluation: GSM8K from the hub, a local JSONL file, or generated ones.

Every source yields the same `Problem`, so training, evaluation and tests never care where data came from.
"""

from __future__ import annotations

from rlstack.payload.data.problems import Problem
from rlstack.payload.data.sources import DataError, load_problems

__all__ = ["DataError", "Problem", "load_problems"]
