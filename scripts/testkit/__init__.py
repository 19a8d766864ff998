"""What the project's own tests (``tests/``) and its scripts share: stand-in servers' side of
the wire format (``wire_server``), the hostile clients of a metadata server
(``hostile_patterns``) and the raw HTTP/2 they speak (``h2_frames``).

Importable from both without touching ``sys.path``: a script run as ``python scripts/x.py``
has ``scripts/`` first on its path (Python puts the script's folder there), and pytest adds
``scripts/`` for ``tests/`` (``pythonpath`` in ``pyproject.toml``). Nothing here is shipped.
"""
