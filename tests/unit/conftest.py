"""Unit tests build runs with output folders under pytest's temporary folder."""

from tests.outputs import allow_temporary_outputs  # noqa: F401 (an autouse fixture)
