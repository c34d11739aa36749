"""Shared utilities, the bottom layer: name registries, verified file I/O and seeding.

Every other package may import this one; it imports none of them (``tests/test_layers.py`` checks the order).
"""
