"""The prompt strings of the Cross-Lingual Pitfalls release (xzx34/Cross-Lingual-Pitfalls, kept in
../shared/data/cross_lingual_pitfalls/release/ for tests), read from its files without running them:
the f-strings of `utils/prompt.py` become templates with `{name}` placeholders (literal braces doubled),
the simulation instructions are the dict literal of `utils/answers.py` `simulate`."""

from __future__ import annotations

import ast
from pathlib import Path

RELEASE = Path(__file__).resolve().parents[1].parent.parent / "shared" / "data" / "cross_lingual_pitfalls" / "release"
if not RELEASE.is_dir():  # a worktree two levels down, or the main checkout one level down
    RELEASE = Path(__file__).resolve().parents[2] / "shared" / "data" / "cross_lingual_pitfalls" / "release"


def _template(node: ast.expr) -> str:
    if isinstance(node, ast.Constant):
        return node.value.replace("{", "{{").replace("}", "}}")
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(value.value.replace("{", "{{").replace("}", "}}"))
        else:
            parts.append("{" + ast.unparse(value.value) + "}")
    return "".join(parts)


def prompt_templates() -> dict[str, str]:
    """Function name -> the template its f-string returns (utils/prompt.py)."""
    tree = ast.parse((RELEASE / "utils" / "prompt.py").read_text(encoding="utf-8"))
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and isinstance(node.body[-1], ast.Return):
            found[node.name] = _template(node.body[-1].value)
    return found


def simulation_instructions() -> dict[str, str]:
    """Language name -> the instruction `simulate` puts before the question (utils/answers.py)."""
    tree = ast.parse((RELEASE / "utils" / "answers.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "question_prompt":
            return {key.value: ast.literal_eval(value) if isinstance(value, ast.Constant) else _template(value)
                    .replace("{{", "{").replace("}}", "}")
                    for key, value in zip(node.value.keys, node.value.values, strict=True)}
    raise LookupError("no question_prompt in utils/answers.py")
