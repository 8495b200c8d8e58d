"""Let PyPI's torchvision import beside the CPU torch (used by ``tests/run`` after installing the sglang extra).

SGLang's configs import torchvision (its image transforms). PyPI's torchvision wheel is a CUDA build: its
compiled ops do not load against the CPU torch, and two unguarded ``torch.library.register_fake`` calls in
``torchvision/_meta_registrations.py`` then fail the import ("operator torchvision::nms does not exist").
This script makes those two registrations conditional on ``torchvision.extension._has_ops()``, as the file's
other registrations already are; the transforms SGLang uses need no compiled op. It is idempotent and fails
loudly when the file no longer looks as expected, and checks the import afterwards.

Usage: ``python tests/sglang_env/fix_torchvision.py`` with the virtualenv's python.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

_UNGUARDED = re.compile(r'^@torch\.library\.register_fake\("(torchvision::\w+)"\)$', re.MULTILINE)
_GUARDED = '@(torch.library.register_fake("{op}") if torchvision.extension._has_ops() else (lambda fn: fn))'


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        print("fix_torchvision: torchvision is not installed", file=sys.stderr)
        return 1
    path = Path(spec.origin).parent / "_meta_registrations.py"
    text = path.read_text()
    fixed, count = _UNGUARDED.subn(lambda m: _GUARDED.format(op=m.group(1)), text)
    if count:
        path.write_text(fixed)
        print(f"fix_torchvision: guarded {count} registrations in {path}")
    elif "torchvision.extension._has_ops() else (lambda fn: fn)" not in text:
        print(f"fix_torchvision: {path} does not look as expected", file=sys.stderr)
        return 1
    check = subprocess.run([sys.executable, "-c", "import torchvision.transforms"], check=False)
    return check.returncode


if __name__ == "__main__":
    sys.exit(main())
