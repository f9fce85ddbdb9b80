"""The one version number (``deltackpt.__version__``): pyproject.toml reads it (setuptools dynamic
version) and every manifest records it.  A module of its own so that the repository layer can read
it without importing the package's public names (``deltackpt/__init__.py`` names them all for
type checkers, which import-linter counts as imports)."""

__version__ = "0.1.0"
