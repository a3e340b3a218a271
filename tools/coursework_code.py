"""Code surgery for the coursework build (tools/coursework.py): what a student version keeps of
the chapters' hidden cells, and what an autograder test keeps of a solution's check cell.

A chapter's hidden cells (tags ``remove-cell``/``remove-input``) do three things: they assert the
chapter's claims, they ``glue`` numbers into the prose for the book, and now and then they compute
something a later cell reads. A student version keeps only the last: asserts and ``glue`` calls
are dropped, then every statement that binds only names no remaining code reads (iterated, so a
name that only fed a dropped ``glue`` goes too), and a cell left empty is dropped. A solution's
check cell becomes an autograder test: its ``glue`` calls are dropped and its asserts kept, with
the statements they read. A visible cell keeps its text but loses its ``glue`` calls too: the book
glues a figure and closes it (a numbered, captioned ``glue:figure`` shows it), and the student
version shows the figure where the cell draws it instead (``show_figures``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from IPython.core.inputtransformer2 import TransformerManager

HIDDEN_TAGS = frozenset({"remove-cell", "remove-input"})
_IPYTHON = TransformerManager()


def parse(source: str, where: str) -> ast.Module:
    """The cell's code as a module; IPython syntax (``%pip``, ``!ls``) is translated first."""
    try:
        return ast.parse(_IPYTHON.transform_cell(source))
    except SyntaxError as err:
        raise ValueError(
            f"{where}: cannot parse the cell's code ({err.msg}, line {err.lineno})"
        ) from err


def reads(tree: ast.AST) -> set[str]:
    """Every name the code loads (a name read anywhere, at any depth)."""
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def binds(stmt: ast.stmt) -> set[str]:
    """Names a statement may set or change: assigned, imported or defined names, and the base
    names of items and attributes it writes through and of method calls made as statements
    (``d[k] = v``, ``xs.append(x)``)."""
    found: set[str] = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            found.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Subscript | ast.Attribute) and isinstance(node.ctx, ast.Store):
            found |= _base(node)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            found |= _base(node.value.func) if isinstance(node.value.func, ast.Attribute) else set()
    defs = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    return found - _local_names(stmt) | ({stmt.name} if isinstance(stmt, defs) else set())


def _base(node: ast.expr) -> set[str]:
    while isinstance(node, ast.Subscript | ast.Attribute):
        node = node.value
    return {node.id} if isinstance(node, ast.Name) else set()


def is_glue(stmt: ast.stmt) -> bool:
    """A call of ``glue`` (the book's way of putting a number into the prose; leakagelib.glue)."""
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "glue"


def show_figures(source: str, where: str) -> str:
    """A visible cell as a notebook without Sphinx runs it: its ``glue`` calls are dropped, and
    ``plt.close(fig)`` of a figure it glued becomes ``plt.show()``, so that the figure the book
    captions is shown under the cell. Every other line keeps its text (comments, layout)."""
    tree = parse(source, where)
    glued = [s for s in ast.walk(tree) if isinstance(s, ast.stmt) and is_glue(s)]
    if not glued:
        return source
    loops = [s for s in ast.walk(tree) if _only_glue(s)]  # e.g. a loop that glues several keys
    lines = source.splitlines()
    if len(_IPYTHON.transform_cell(source).splitlines()) != len(lines):
        raise ValueError(f"{where}: a cell that glues cannot hold a cell magic")
    figures = {a.id for s in glued for a in s.value.args[1:2] if isinstance(a, ast.Name)}
    closes = [
        s
        for s in ast.walk(tree)
        if isinstance(s, ast.Expr)
        and isinstance(s.value, ast.Call)
        and ast.unparse(s.value.func) == "plt.close"
        and [ast.unparse(a) for a in s.value.args] in ([f] for f in figures)
    ]
    dropped = {i for s in glued + loops + closes for i in range(s.lineno - 1, s.end_lineno)}
    show = {s.lineno - 1: " " * s.col_offset + "plt.show()" for s in closes}
    shown = "\n".join(
        show.get(i, line) for i, line in enumerate(lines) if i in show or i not in dropped
    )
    parse(shown, f"{where} (its figures shown)")  # no block left empty, no statement cut
    return shown


def _only_glue(stmt: ast.AST) -> bool:
    """A loop, ``with`` or ``if`` (without ``else``) whose body only glues: nothing is left of it."""
    if not isinstance(stmt, (ast.For, ast.While, ast.With, ast.If)) or getattr(stmt, "orelse", []):
        return False
    return all(is_glue(s) or _only_glue(s) for s in stmt.body)


class _Drop(ast.NodeTransformer):
    """Removes ``glue`` calls (and asserts, if asked) at any depth. A statement whose body is
    left empty goes with them (an ``else`` with it); an ``except`` left empty gets a ``pass``."""

    def __init__(self, asserts: bool):
        self.asserts = asserts

    def generic_visit(self, node: ast.AST) -> ast.AST | None:
        super().generic_visit(node)
        if getattr(node, "body", None) == [] and not isinstance(node, ast.Module):
            if isinstance(node, ast.stmt):
                return None
            node.body = [ast.Pass()]  # an except clause or a match case
        return node

    def visit_Assert(self, node: ast.Assert) -> ast.AST | None:
        return None if self.asserts else node

    def visit_Expr(self, node: ast.Expr) -> ast.AST | None:
        return None if is_glue(node) else node


def surgery(source: str, where: str, asserts: bool) -> tuple[list[ast.stmt], list[str]]:
    """The cell's top-level statements without ``glue`` calls (and without asserts if
    ``asserts``), and the cell's code as Python (IPython syntax translated) to render them from."""
    python = _IPYTHON.transform_cell(source)
    tree = parse(source, where)
    originals = {ast.dump(s): (s.lineno, s.end_lineno) for s in tree.body}
    body = _Drop(asserts).visit(tree).body
    for stmt in body:
        stmt.original_lines = originals.get(ast.dump(stmt))
    return body, python.splitlines()


def needed(stmts: list[ast.stmt], read_elsewhere: set[str], keep_asserts: bool) -> list[ast.stmt]:
    """The statements worth keeping: one that asserts (if ``keep_asserts``), a bare expression,
    or one binding a name read by a later kept statement or by other code (``read_elsewhere``).
    A loop's variable does not count: names like ``attack`` recur, and a loop kept only for
    its variable would be a loop that computes nothing anyone reads."""
    kept: list[ast.stmt] = []
    later = set(read_elsewhere)
    for stmt in reversed(stmts):
        asserts = keep_asserts and any(isinstance(n, ast.Assert) for n in ast.walk(stmt))
        plain = isinstance(stmt, ast.Expr) or asserts
        loops = [n.target for n in ast.walk(stmt) if isinstance(n, ast.For | ast.AsyncFor)]
        if plain or (binds(stmt) - set().union(*map(_stored, loops))) & later:
            kept.append(stmt)
            later |= reads(stmt)
    return kept[::-1]


def render(stmts: Iterable[ast.stmt], python: list[str]) -> str:
    """Code for the statements: one the surgery left whole keeps its original text (comments
    and layout with it), a changed one is unparsed."""
    out = []
    for stmt in stmts:
        span = getattr(stmt, "original_lines", None)
        out.append("\n".join(python[span[0] - 1 : span[1]]) if span else ast.unparse(stmt))
    return "\n".join(out)


def has_assert(source: str, where: str) -> bool:
    """Whether the cell asserts anything (a hidden cell in a solution that does is a check)."""
    return any(isinstance(n, ast.Assert) for n in ast.walk(parse(source, where)))


def assigns(stmt: ast.stmt) -> set[str]:
    """Names a statement assigns or defines (not imports: an answer need not import alike)."""
    names = {
        n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    defs = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    return names - _local_names(stmt) | ({stmt.name} if isinstance(stmt, defs) else set())


def free(stmts: list[ast.stmt], bound: frozenset[str] = frozenset()) -> list[str]:
    """Names the statements read before binding them, in order of first reading. A loop's or
    ``with``'s target is bound in its body, and names local to a comprehension, lambda or
    function are not free."""
    known, found = set(bound), {}
    for stmt in stmts:
        if isinstance(stmt, ast.For | ast.AsyncFor):
            inner = frozenset(known | _stored(stmt.target))
            names = _loads(stmt.iter) + free(stmt.body + stmt.orelse, inner)
        elif isinstance(stmt, ast.If | ast.While):
            names = _loads(stmt.test) + free(stmt.body, frozenset(known))
            names += free(stmt.orelse, frozenset(known))
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            names = [n for item in stmt.items for n in _loads(item.context_expr)]
            targets = [_stored(i.optional_vars) for i in stmt.items if i.optional_vars]
            names += free(stmt.body, frozenset(known.union(*targets)))
        else:
            names = _loads(stmt)
        found.update((name, None) for name in names if name not in known)
        known |= binds(stmt)
    return list(found)


def _loads(node: ast.AST) -> list[str]:
    """Names an expression or simple statement loads, in source order, less its local names."""
    local = _local_names(node)
    loads = sorted(
        (n.lineno, n.col_offset, n.id)
        for n in ast.walk(node)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    )
    return [name for *_, name in loads if name not in local]


def _stored(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _local_names(stmt: ast.AST) -> set[str]:
    scopes = ast.comprehension | ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef
    local: set[str] = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.comprehension):
            local |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        elif isinstance(node, scopes):
            local |= {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
            body = node.body if isinstance(node.body, list) else []
            local |= {name for s in body for name in binds(s)}
    return local
