"""Same-run baselines for the CPU benchmarks: import files of this repository as they were at an
older git revision, next to the live ones (``bench_radix.py``, ``bench_admission.py``)."""

from __future__ import annotations

import os
import sys
import types


def load_baseline(rev: str, paths: list[str], package: str = "_radixlm_baseline") -> types.ModuleType:
    """Import files of this repository as they were at git revision ``rev`` (e.g. ``HEAD~2``), as
    the package ``package`` in a temporary directory, for same-run before/after timings.

    ``paths``: repository paths of ``.py`` files, or directories (all their ``.py`` files).
    ``radix/x.py`` becomes ``package.radix.x`` and ``runtime/x.py`` ``package.x``; imports of
    those modules inside them are rewritten to the copies, every other ``radixlm`` import stays the
    live one. Returns the package. Raises ``subprocess.CalledProcessError`` for an unknown rev.
    """
    import subprocess
    import tempfile

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = []
    for path in paths:
        if path.endswith(".py"):
            files.append(path)
            continue
        out = subprocess.run(["git", "-C", repo, "ls-tree", "--name-only", f"{rev}:{path}"],
                             check=True, capture_output=True, text=True).stdout.split()
        files += [f"{path}/{name}" for name in out if name.endswith(".py")]
    target = {f: ("radix/" + os.path.basename(f) if f.startswith("radix/") else os.path.basename(f)) for f in files}
    renames = {"radixlm." + f[:-3].replace("/", "."): package + "." + t[:-3].replace("/", ".")
               for f, t in target.items()}
    root = tempfile.mkdtemp(prefix="bench_baseline_")
    os.makedirs(os.path.join(root, package, "radix"))
    for d in (package, package + "/radix"):
        open(os.path.join(root, d, "__init__.py"), "a").close()
    for f, t in target.items():
        text = subprocess.run(["git", "-C", repo, "show", f"{rev}:{f}"], check=True, capture_output=True,
                              text=True).stdout
        for old in sorted(renames, key=len, reverse=True):
            text = text.replace(old + " ", renames[old] + " ").replace(old + "\n", renames[old] + "\n")
        text = text.replace("from radixlm.radix import", f"from {package}.radix import")
        with open(os.path.join(root, package, t), "w") as fh:
            fh.write(text)
    sys.path.insert(0, root)
    import importlib

    for t in target.values():
        importlib.import_module(package + "." + t[:-3].replace("/", ".").removesuffix(".__init__"))
    return importlib.import_module(package)
