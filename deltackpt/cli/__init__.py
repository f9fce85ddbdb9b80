"""The ``deltackpt`` command: parse, call the public API, render text or --json."""
