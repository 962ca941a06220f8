"""sigstore-python's layering, kept: ``kernelbake.signing._internal`` sits below the public
signing modules and imports only leaf modules, never the layer above it (an import loop once)."""

from __future__ import annotations

import ast
from pathlib import Path

import kernelbake.signing._internal as internal

# Vocabulary shared by both layers; none of them imports anything of signing's public layer.
# (textfile: the bounded reader of every file a user names, the trust config included;
# contract.jsondoc: the bounded JSON parser, which imports nothing of ours.)
ALLOWED = {
    "kernelbake.cache",
    "kernelbake.contract.jsondoc",
    "kernelbake.errors",
    "kernelbake.signing.errors",
    "kernelbake.signing.formats",
    "kernelbake.textfile",
}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            # `from kernelbake.signing import formats` imports a module, not a name.
            found.update(f"{node.module}.{a.name}" for a in node.names if node.module == "kernelbake.signing")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("kernelbake") and m != "kernelbake.signing"}


def test_internal_modules_never_import_the_public_layer() -> None:
    files = sorted(Path(internal.__file__).parent.glob("*.py"))
    assert len(files) >= 3  # __init__, certs, keyless, …: the glob found the package
    wrong = {
        f.name: sorted(m for m in _imports(f) if m not in ALLOWED and not m.startswith(internal.__name__))
        for f in files
    }
    assert not {k: v for k, v in wrong.items() if v}, wrong


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from kernelbake.signing.signer import KeySigner\n")
    assert _imports(bad) == {"kernelbake.signing.signer"}
