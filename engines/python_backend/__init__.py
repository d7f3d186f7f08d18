"""Triton's Python backend: a repository's ``model.py`` (``TritonPythonModel``) served as is.

``pb_utils`` is Triton's ``triton_python_backend_utils`` (registered under that top-level
name while a Python model loads), ``engine`` runs a model's lifecycle on one thread,
``autocomplete`` is the config object ``auto_complete_config`` edits.

Process isolation (the default, Triton's stub): ``process_engine`` is the server's engine
for one instance and restarts its worker, ``stub_host`` starts and talks to one worker
process, ``stub`` is that process (it runs ``engine``), ``channel`` carries small pickled
messages over a Unix socket, ``shm`` the tensors in shared memory, ``protocol`` what the
messages mean, ``metrics_bridge`` custom metrics across the two, ``autocomplete_process``
runs ``auto_complete_config`` (the model's first import) in a short-lived process.
"""

from __future__ import annotations
