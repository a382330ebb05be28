"""The package's layering (docs/design.md "Layers"): every import, at module level or inside a function,
goes from a layer to the same or a lower one; no module imports itself back through others; only
`babelprobe.cli` knows about argparse; `import babelprobe` stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "babelprobe"


def design_layers() -> list[tuple[str, list[str]]]:
    """The layers, lowest first, as the Layers section of docs/design.md writes them:
    `basics (errors, ...)` names a layer and its modules, `comparison (+ jobs)` adds modules to a layer
    named after its first one, `items, models` lists a layer's modules."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1]
    block = section.split("```", 2)[1]
    layers = []
    for part in " ".join(block.split()).split("->"):
        part = part.strip()
        name, _, inside = part.partition("(")
        names = [n.strip() for n in name.split(",") if n.strip()]
        extra = [n.strip().lstrip("+").strip() for n in inside.rstrip(")").split(",") if n.strip()]
        if inside and not inside.lstrip().startswith("+"):  # "basics (errors, ...)": a name and its modules
            layers.append((names[0], extra))
        else:
            layers.append((", ".join(names), names + extra))
    return layers


# Lowest first. A module may import its own layer and the layers before it.
LAYERS = design_layers()
RANK = {top: rank for rank, (_, tops) in enumerate(LAYERS) for top in tops}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def walk(tree: ast.AST):
    """Every node, the bodies of `if TYPE_CHECKING:` included: an import for annotations only still ties
    two modules together, so it follows the same rules."""
    yield from ast.walk(tree)


def imports(path: Path, known: set[str]) -> set[str]:
    """Every babelprobe module `path` imports, wherever the import statement is (`from pkg import mod`
    imports `pkg.mod`; `from pkg import name` imports `pkg`)."""
    out = set()
    for node in walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("babelprobe"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("babelprobe"))
    return out


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    return RANK.get(parts[1]) if len(parts) > 1 else None  # `babelprobe` itself: the lazy public API


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {m for m in imports(path, set(known)) if m in known and m != name} for name, path in known.items()}


def test_every_module_belongs_to_a_layer():
    unplaced = sorted(m for m in modules() if m != "babelprobe" and layer_of(m) is None)
    assert not unplaced, f"add these to the Layers section of docs/design.md: {unplaced}"


def test_the_design_names_every_layer_once_and_only_existing_modules():
    tops = [top for _, names in LAYERS for top in names]
    assert len(tops) == len(set(tops)), tops
    existing = {path.stem if path.is_file() else path.name for path in PACKAGE.iterdir()
                if (path.suffix == ".py" or (path / "__init__.py").exists()) and path.name != "__init__.py"}
    assert not set(tops) - existing, f"docs/design.md names modules that do not exist: {set(tops) - existing}"
    assert LAYERS[0][0] == "basics" and LAYERS[-1][0] == "cli"


def test_imports_go_downward_only():
    upward = [f"{a} (layer {LAYERS[layer_of(a)][0]}) imports {b} (layer {LAYERS[layer_of(b)][0]})"
              for a, targets in graph().items() if a != "babelprobe"
              for b in targets if layer_of(b) is not None and layer_of(b) > layer_of(a)]
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    edges, cycles = graph(), []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("banned", ["argparse", "babelprobe.cli"])
def test_only_the_cli_knows_argparse(banned):
    offenders = []
    for name, path in modules().items():
        if name.startswith("babelprobe.cli") or name == "babelprobe.__main__":
            continue
        for node in walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == banned or n.startswith(banned + ".") for n in names):
                offenders.append(name)
    assert not offenders, f"{banned} imported outside babelprobe/cli: {sorted(set(offenders))}"


def test_import_babelprobe_is_light():
    code = ("import sys, babelprobe; heavy = [m for m in ('matplotlib', 'babelprobe.benchmarks.core.generate', "
            "'babelprobe.analysis', 'transformers') if m in sys.modules]; print(heavy); assert not heavy")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_public_names_resolve():
    import babelprobe as bp

    for name in bp.__all__:
        assert getattr(bp, name) is not None, name
    assert callable(bp.compare) and callable(bp.probe)  # functions, not the modules of similar names
