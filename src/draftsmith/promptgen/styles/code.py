"""The `code` style: complete a function's body from its signature (rebuilt from the AST)
and its docstring, for the public documented functions and methods of the standard library
and named packages; held out by module, as `docstrings` holds out."""

from __future__ import annotations

import ast
import copy
import importlib.metadata
import platform
import re
import textwrap
from collections.abc import Iterator

from draftsmith.promptgen.docstrings import (
    documented_nodes,
    held_out,
    module_files,
    module_hash,
    normalised,
    source_roots,
)
from draftsmith.promptgen.styles.common import Candidate

CODE_TASKS = (
    "Complete the body of this Python {kind} from `{module}` so that it does what its "
    "docstring says. Keep the signature and the docstring as they are.",
    "Here are the signature and docstring of `{name}` from the module `{module}`. "
    "Write the rest of the {kind}.",
    "Implement the Python {kind} below. Its docstring describes the behaviour; reply with the whole {kind}.",
    "Fill in the missing body of `{name}` ({module}), following its docstring.",
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def code_candidates(packages: list[str], stdlib: bool = True) -> Iterator[Candidate]:
    """One code prompt per public documented function or method, walked in
    `docstrings`' order; a docstring seen before is skipped as it skips it."""
    seen: set[str] = set()
    for prefix, root in source_roots(packages, stdlib):
        package, version = package_version(prefix)
        for module, path in module_files(prefix, root):
            held = held_out(module)
            for node, name, doc in documented_nodes(path):
                key = normalised(doc)
                if key in seen:
                    continue
                seen.add(key)
                block = code_block(node, name, doc)
                if block is not None:
                    row = {"id": f"{module}.{name}", "prompt": _code_prompt(module, name, block)}
                    origin = {"package": package, "version": version, "module": module, "name": name}
                    yield Candidate(held, row | {"source": "package"} | origin)


def package_version(prefix: str) -> tuple[str, str]:
    """(package label, version) of a source root: `python-stdlib` for the standard library."""
    if not prefix:
        return "python-stdlib", platform.python_version()
    names = importlib.metadata.packages_distributions().get(prefix) or [prefix]
    try:
        return prefix, importlib.metadata.version(names[0])
    except importlib.metadata.PackageNotFoundError:
        return prefix, "unknown"


def code_block(node: ast.AST, name: str, doc: str) -> str | None:
    """Decorators, `def` line and docstring of a function (a method under its class line);
    None for a class or a docstring that cannot be written back as a literal."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not _lines_kept(node):
        return None
    owner = name.rpartition(".")[0]
    docstring = _docstring(doc, "        " if owner else "    ")
    if docstring is None:
        return None
    stub = copy.copy(node)  # shallow: the signature is shared, only the body is replaced
    stub.body = [ast.Pass()]
    signature = ast.unparse(stub).rsplit("\n", 1)[0]
    if owner:
        signature = f"class {owner}:\n" + textwrap.indent(signature, "    ")
    return f"{signature}\n{docstring}"


def _lines_kept(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the docstring's newlines are its source lines: a `\\n` escape (or a
    backslash continuation) would come out as a broken line in a garbled indentation."""
    literal = node.body[0].value  # a docstring: an expression of one str constant
    return literal.value.count("\n") == literal.end_lineno - literal.lineno


def _docstring(doc: str, indent: str) -> str | None:
    if '"""' in doc or _CONTROL.search(doc):
        return None
    quote = 'r"""' if "\\" in doc else '"""'
    lines = doc.splitlines()
    if len(lines) == 1 and not doc.endswith(('"', "\\")):
        return f'{indent}{quote}{doc}"""'
    rest = [f"{indent}{line}" if line else "" for line in lines[1:]]
    return "\n".join([f"{indent}{quote}{lines[0]}", *rest, f'{indent}"""'])


def _code_prompt(module: str, name: str, block: str) -> str:
    kind = "method" if "." in name else "function"
    task = CODE_TASKS[module_hash(f"{module}.{name}") % len(CODE_TASKS)]
    return f"{task.format(kind=kind, name=name, module=module)}\n\n```python\n{block}\n```"
