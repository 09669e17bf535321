"""Runnable examples of shardherd pipelines."""
