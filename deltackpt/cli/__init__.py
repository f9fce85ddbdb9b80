"""The ``deltackpt`` command: parse, call the public API, render text or --json.

What it may import: everything below it (the public API through ``deltackpt``, and
``integrations.files`` for import/export); it holds no logic of its own beyond parsing and
rendering, so every command is also a call of the library.
"""
