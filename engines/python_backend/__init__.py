"""Triton's Python backend: a repository's ``model.py`` (``TritonPythonModel``) served as is.

``pb_utils`` is Triton's ``triton_python_backend_utils`` (registered under that top-level
name while a Python model loads), ``engine`` runs a model's lifecycle on its instance's
engine thread, ``autocomplete`` is the config object ``auto_complete_config`` edits.
"""

from __future__ import annotations
