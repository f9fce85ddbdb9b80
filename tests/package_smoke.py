"""`make package`'s smoke test: run by the python of a fresh venv where only the built wheel (or
sdist) and its dependencies are installed, from a folder outside the source tree.

``python tests/package_smoke.py wheel`` checks that the installed package (not the source tree) is
imported, ships py.typed, its license and (where a C compiler is) its compiled loops, saves and
loads bit-identically, records its version in the manifest, and that the ``deltackpt`` console
script lists the version.  Not collected by pytest
(its name does not start with test_): it needs the fresh venv `make package` builds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from importlib import metadata


def main(kind: str) -> None:
    import torch

    import deltackpt

    site = sysconfig.get_paths()["purelib"]
    assert os.path.realpath(deltackpt.__file__).startswith(os.path.realpath(site)), deltackpt.__file__
    assert metadata.version("deltackpt") == deltackpt.__version__
    assert os.path.exists(os.path.join(os.path.dirname(deltackpt.__file__), "py.typed")), "py.typed is not shipped"
    files = [str(f) for f in metadata.files("deltackpt") or []]
    assert any(f.endswith("LICENSE") for f in files), "the LICENSE file is not shipped"
    from deltackpt.codecs import native_planes
    if shutil.which("cc") is not None:   # built where the wheel was, and where the sdist installs
        assert native_planes.compiled(), f"the compiled loops (codecs/_planes.c) are missing from the {kind}"
    folder = tempfile.mkdtemp(prefix="deltackpt-smoke-")
    try:
        repo = os.path.join(folder, "ckpt")
        model = torch.nn.Linear(64, 64)
        v = deltackpt.save(model, repo, step=1)
        back = deltackpt.load(repo)
        assert all(torch.equal(back[k], t) for k, t in model.state_dict().items())
        assert deltackpt.Repo(repo).core.manifest(v.id).writer == f"deltackpt {deltackpt.__version__}"
        script = os.path.join(os.path.dirname(sys.executable), "deltackpt")
        out = subprocess.run([script, "log", "--repo", repo], capture_output=True, text=True, check=True).stdout
        assert v.short_id in out, out
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"package smoke test ({kind}): deltackpt {deltackpt.__version__} from {os.path.dirname(deltackpt.__file__)} ok")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "installed")
