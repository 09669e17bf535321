"""Tests of the documentation: citations and code snippets."""
