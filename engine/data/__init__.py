"""Datasets: parquet files with the columns `prompt` and `reward_func_args`, their loader and
the generators behind `eslab data` (countdown, gsm8k, conciseness)."""

from engine.data.datasets import DatasetError, Example, WriteResult, load_dataset, write_dataset

__all__ = ["DatasetError", "Example", "WriteResult", "load_dataset", "write_dataset"]
