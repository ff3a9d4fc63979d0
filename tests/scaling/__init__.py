"""Tests of the scaling plan, its history and its timings."""
