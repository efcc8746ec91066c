"""Healthy runs written by real writers, on which klwatch must find nothing (see README.md)."""
