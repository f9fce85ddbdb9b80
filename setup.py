"""The one compiled part: byte planes to elements and back in one pass (deltackpt/codecs/_planes.c).

Everything else is in pyproject.toml.  The extension is optional: where it cannot be built (no C
compiler, no Python headers) the package installs without it and decodes through c-blosc or numpy,
the same bytes, more slowly (deltackpt/codecs/native_planes.py says which path runs).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("deltackpt.codecs._planes", ["deltackpt/codecs/_planes.c"],
                             extra_compile_args=["-O3"], optional=True)])
