"""Helpers the tests share (fixtures, harnesses): imported by test files, never collected."""
