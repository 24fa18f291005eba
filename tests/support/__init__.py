"""Helpers shared by test modules (fixtures stay in ``conftest.py`` files).

One module per concern; test modules import from here, never from a ``conftest``.
"""
