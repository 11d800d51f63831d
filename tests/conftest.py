"""Shared test helpers live beside this file (``tiny_programs.py``); pytest puts this folder on
``sys.path`` because this conftest is here, so tests in sub-folders can import them too."""
