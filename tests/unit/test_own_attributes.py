"""No object's attribute is assigned from outside it: each role is made with what it needs
and changes its own state (``self.x = ...``, or a method of its own); tests build roles with
constructor arguments, subclasses or ``monkeypatch.setattr`` on a class, never by
overwriting an instance's attribute (``coordinator.acquirer.get_lease = fake``)."""

from __future__ import annotations

import ast

from tests.helpers.sources import python_files

#: assignments allowed though their object is not ``self``: (a file, or a folder ending in
#: "/"; the target, ``x.*`` for any attribute of ``x``, ``*`` for any) -> why
ALLOWED: dict[tuple[str, str], str] = {
    # plain records, filled in by the module that owns them
    ("rasd/wire.py", "req.*"): "a Request record, filled by the parser of its own module",
    ("rasd/dynamo/ddb.py", "conn.*"): "a connection's bookkeeping, in the pool that owns it",
    ("rasd/daemon/prefetch.py", "buf.why_empty"): "a buffer's record of its last sweep",
    ("rasd/observe/prom.py", "h.total"): "a histogram's record, in its own module",
    ("rasd/observe/prom.py", "Server.refused"): "the metrics server class's own count",
    # a connection's grant and requests in flight: plain state on the request path (a
    # method call there would cost every request)
    ("rasd/server/connection.py", "conn.grant"): "regrant, in the module of Connection",
    ("rasd/server/routing.py", "conn.pending"): "the requests a connection has in flight",
    ("rasd/server/routing.py", "counters.hits"): "the hit's counter, bumped in place",
    ("tests/unit/test_hit_fast.py", "conn.*"): "a connection's grant and count, as a case",
    # third-party objects (moto, werkzeug, botocore, subprocess), and the test doubles
    ("rasd/devtools/motoserver.py", "*"): "moto's and werkzeug's objects, patched to serve",
    ("tests/doubles/", "*"): "the doubles' own fakes",
    ("tests/tiers.py", "proc.returncode"): "a Popen waited for with os.wait4",
    ("tests/unit/test_retry.py", "ctx.*"): "botocore's retry context, made by the test",
    ("tests/unit/test_admin_exit_codes.py", "exc.*"): "an exception made by the test",
    ("tests/unit/test_ddb.py", "*"): "credentials and connections of a client under test",
    # records of state a test puts in the case it checks: not roles
    ("tests/unit/test_check.py", "w.*"): "the checker's world, a record of modelled state",
    ("tests/unit/test_prefetch.py", "b.rate"): "a buffer's demand estimate",
    ("tests/unit/test_prefetch_fair.py", "*"): "a buffer's view of the fleet",
    ("tests/unit/test_sim_witness.py", "*"): "the simulator's result records",
    ("tests/integration/test_outage_budget.py", "proxy.plan.outage"): "the proxy's fault plan",
    # fake clocks reached through what holds them
    ("tests/", "clock.t"): "a FakeClock's time",
    ("tests/", "p.clock.t"): "a FakeClock's time",
}


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        out: list[ast.expr] = []
        for t in node.targets:
            out.extend(t.elts if isinstance(t, ast.Tuple | ast.List) else [t])
        return out
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def _own_fakes(tree: ast.Module) -> set[str]:
    """Names this file binds to an object of a class it defines or imports from tests/ (its
    own fakes: a fake clock, a harness), by ``x = Fake(...)``, ``x: Fake`` or ``with Fake()
    as x``: their attributes are the test's to set."""
    classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("tests")):
            classes.update(a.asname or a.name for a in n.names)

    def fake(e: ast.expr | None) -> bool:
        if isinstance(e, ast.Call):
            e = e.func
        if isinstance(e, ast.Subscript):
            e = e.value
        return isinstance(e, ast.Name) and e.id in classes

    names: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and fake(n.value):
            names.update(t.id for t in n.targets if isinstance(t, ast.Name))
        elif isinstance(n, ast.AnnAssign | ast.arg) and fake(n.annotation):
            name = n.target if isinstance(n, ast.AnnAssign) else None
            names.add(name.id if isinstance(name, ast.Name) else getattr(n, "arg", ""))
        elif (
            isinstance(n, ast.withitem)
            and fake(n.context_expr)
            and isinstance(n.optional_vars, ast.Name)
        ):
            names.add(n.optional_vars.id)
    return names


def outside_assignments(source: str, path: str = "<snippet>") -> list[str]:
    """``path:line target`` of each assignment to an attribute of an object other than
    ``self`` (or ``cls``) in ``source``: not one of the file's own fakes, not allowed."""
    tree = ast.parse(source)
    fakes = _own_fakes(tree) if path.startswith("tests/") else set()
    found = []
    for node in ast.walk(tree):
        for t in _targets(node):
            if not isinstance(t, ast.Attribute):
                continue
            root = _root(t)
            if isinstance(root, ast.Name) and (root.id in ("self", "cls") or root.id in fakes):
                continue
            target = ast.unparse(t)
            head = target.split(".", 1)[0]
            places = {path, *(path[: i + 1] for i, ch in enumerate(path) if ch == "/")}
            if any((f, x) in ALLOWED for f in places for x in (target, f"{head}.*", "*")):
                continue
            found.append(f"{path}:{node.lineno} {target}")
    return found


def test_no_attribute_of_another_object_is_assigned() -> None:
    found = []
    for path, rel in python_files(("rasd", "tests")):
        found += outside_assignments(path.read_text(), rel)
    assert not found, "assigned from outside their object:\n" + "\n".join(found)


def test_the_scan_finds_a_role_patched_from_outside() -> None:
    snippet = (
        "async def test_x(coordinator, fake):\n"
        "    coordinator.acquirer.get_lease = fake\n"
        "    d.store.breaker.cooldown = 600.0\n"
        "    self.ok = 1\n"
    )
    assert outside_assignments(snippet, "tests/unit/test_x.py") == [
        "tests/unit/test_x.py:2 coordinator.acquirer.get_lease",
        "tests/unit/test_x.py:3 d.store.breaker.cooldown",
    ]
    # a test's own fake is its to set; the same assignment on a real object is not
    own = "class Harness:\n    now = 0\n\nh = Harness()\nh.now += 1\n"
    assert outside_assignments(own, "tests/unit/test_x.py") == []
    real = own.replace("h = Harness()", "h = Driver()")
    assert outside_assignments(real, "tests/unit/test_x.py") == ["tests/unit/test_x.py:5 h.now"]
