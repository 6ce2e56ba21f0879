"""Solver family: importing this package registers every built-in solver."""
