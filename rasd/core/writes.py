"""Conditional single-item writes as data. Pure: no I/O.

A :class:`Write` is rendered for DynamoDB's ``UpdateItem`` (:func:`render`) and applied to an
item held as a ``dict`` (:func:`apply`, the checker's model), so the checker checks the very
conditions production sends (docs/schema.md, "Writes").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Value = str | int
Op = Literal[
    "=",
    "<>",
    "<",
    "<=",
    ">",
    ">=",
    "exists",
    "not_exists",
    "absent_or_eq_attr",
    "absent_or_ne",
    "absent_or_le",
]
#: ops whose condition compares no value (``absent_or_eq_attr``'s value names an attribute)
_NO_VALUE = ("exists", "not_exists", "absent_or_eq_attr")
ItemKey = tuple[str, str]  # (client_id, resource): the table's hash and range key


@dataclass(frozen=True, slots=True)
class Cond:
    """``attr op value``. ``absent_or_eq_attr``: ``attr`` is absent, or equal to the
    attribute ``value`` names (both present, same type). ``absent_or_ne``,
    ``absent_or_le``: ``attr`` is absent, or ``<>`` / ``<=`` the value."""

    attr: str
    op: Op
    value: Value | None = None

    def holds(self, item: dict[str, Value] | None) -> bool:
        cur = None if item is None else item.get(self.attr)
        if self.op == "exists":
            return cur is not None
        if self.op == "not_exists":
            return cur is None
        if self.op == "absent_or_eq_attr":
            other = None if item is None else item.get(str(self.value))
            return cur is None or (type(cur) is type(other) and cur == other)
        if self.op in ("absent_or_ne", "absent_or_le"):
            if cur is None:
                return True
            return Cond(self.attr, "<>" if self.op == "absent_or_ne" else "<=", self.value).holds(
                item
            )
        if cur is None or type(cur) is not type(self.value):
            return False  # DynamoDB: a comparison with a missing or other-typed value is false
        v: Any = self.value
        c: Any = cur
        match self.op:
            case "=":
                return bool(c == v)
            case "<>":
                return bool(c != v)
            case "<":
                return bool(c < v)
            case "<=":
                return bool(c <= v)
            case ">":
                return bool(c > v)
            case ">=":
                return bool(c >= v)
        raise AssertionError(self.op)


@dataclass(frozen=True, slots=True)
class Write:
    """One conditional UpdateItem. ``incr`` attributes go up by one (created at 1)."""

    key: ItemKey
    conds: tuple[Cond, ...]
    set: tuple[tuple[str, Value], ...] = ()
    remove: tuple[str, ...] = ()
    incr: tuple[str, ...] = ()
    #: what the write is, for logs and the checker's traces (claim, release, fence, ...)
    kind: str = field(default="write", compare=False)


def apply(item: dict[str, Value] | None, w: Write) -> dict[str, Value] | None:
    """The item after ``w``, or None when a condition fails (the item is then unchanged).
    ``item`` None means the item does not exist."""
    if not all(c.holds(item) for c in w.conds):
        return None
    new: dict[str, Value] = (
        dict(item) if item is not None else {"client_id": w.key[0], "resource": w.key[1]}
    )
    for a, v in w.set:
        new[a] = v
    for a in w.remove:
        new.pop(a, None)
    for a in w.incr:
        cur = new.get(a, 0)
        assert isinstance(cur, int)
        new[a] = cur + 1
    return new


# ------------------------------------------------------------------------------ DynamoDB
def to_av(v: Value) -> dict[str, str]:
    if type(v) is str:
        return {"S": v}
    if isinstance(v, bool):  # bool is an int: never let one slip through as N
        raise TypeError("booleans are not stored")
    if isinstance(v, int):
        return {"N": str(v)}
    return {"S": v}


def from_av(av: dict[str, Any]) -> Value:
    if "S" in av:
        return str(av["S"])
    if "N" in av:
        return int(av["N"])
    raise ValueError(f"unsupported attribute value {av!r}")


def item_from_av(raw: dict[str, dict[str, Any]]) -> dict[str, Value]:
    """A low-level DynamoDB item as a plain dict (S and N attributes only; others skipped)."""
    out: dict[str, Value] = {}
    for k, av in raw.items():  # from_av, inlined: this runs for every item read
        if "S" in av:
            out[k] = str(av["S"])
        elif "N" in av:
            out[k] = int(av["N"])
    return out


def key_av(key: ItemKey) -> dict[str, dict[str, str]]:
    return {"client_id": {"S": key[0]}, "resource": {"S": key[1]}}


_OPS_SQL = {"=": "=", "<>": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
#: ops true where the attribute is absent, else the comparison
_ABSENT_OR = {"absent_or_ne": "<>", "absent_or_le": "<="}


#: Rendered expressions by the shape of a write (see :func:`render`); bounded.
_Template = tuple[str, str | None, dict[str, str] | None, tuple[str, ...]]
_TEMPLATES: dict[tuple[Any, ...], _Template] = {}
_TEMPLATES_MAX = 256


def render(w: Write) -> dict[str, Any]:
    """UpdateItem keyword arguments (without ``TableName``) for ``w``.

    The expressions and attribute names depend only on the write's shape (which attributes
    each condition tests and how, which are set, removed and incremented), never on its
    values; so they are made once per shape (:func:`render_plain`) and only the values are
    filled in, in the order ``render_plain`` numbers them: the conditions' that compare, the
    sets', then the increments' one. Equal to ``render_plain(w)`` (tests/unit/test_writes.py).
    """
    conds = w.conds
    shape = (
        tuple([(c.attr, c.op, c.value if c.op == "absent_or_eq_attr" else None) for c in conds]),
        tuple([a for a, _ in w.set]),
        w.remove,
        w.incr,
    )
    t = _TEMPLATES.get(shape)
    if t is None:
        plain = render_plain(w)
        t = (
            plain["UpdateExpression"],
            plain.get("ConditionExpression"),
            plain.get("ExpressionAttributeNames"),
            tuple(plain.get("ExpressionAttributeValues", ())),
        )
        if len(_TEMPLATES) >= _TEMPLATES_MAX:
            _TEMPLATES.clear()
        _TEMPLATES[shape] = t
    update, cond, names, slots = t
    vals = [c.value for c in conds if c.op not in _NO_VALUE]
    vals.extend([v for _, v in w.set])
    if w.incr:
        vals.append(1)
    k0, k1 = w.key
    kw: dict[str, Any] = {
        "Key": {"client_id": {"S": k0}, "resource": {"S": k1}},
        "UpdateExpression": update,
    }
    if cond is not None:
        kw["ConditionExpression"] = cond
    if names is not None:
        kw["ExpressionAttributeNames"] = dict(names)
    if slots:
        kw["ExpressionAttributeValues"] = {
            k: to_av(v)  # type: ignore[arg-type] # compared conditions carry values
            for k, v in zip(slots, vals, strict=True)
        }
    return kw


def render_plain(w: Write) -> dict[str, Any]:
    """:func:`render` without its cache: the reference it is tested against (and how a
    template is made)."""
    names: dict[str, str] = {}
    values: dict[str, dict[str, str]] = {}

    def n(attr: str) -> str:
        for k, v in names.items():
            if v == attr:
                return k
        k = f"#a{len(names)}"
        names[k] = attr
        return k

    def v(val: Value) -> str:
        k = f":v{len(values)}"
        values[k] = to_av(val)
        return k

    conds: list[str] = []
    for c in w.conds:
        if c.op == "exists":
            conds.append(f"attribute_exists({n(c.attr)})")
        elif c.op == "not_exists":
            conds.append(f"attribute_not_exists({n(c.attr)})")
        elif c.op == "absent_or_eq_attr":
            a = n(c.attr)
            conds.append(f"(attribute_not_exists({a}) OR {a} = {n(str(c.value))})")
        elif c.op in _ABSENT_OR:
            assert c.value is not None
            a = n(c.attr)
            conds.append(f"(attribute_not_exists({a}) OR {a} {_ABSENT_OR[c.op]} {v(c.value)})")
        else:
            assert c.value is not None
            conds.append(f"{n(c.attr)} {_OPS_SQL[c.op]} {v(c.value)}")
    parts: list[str] = []
    sets = [f"{n(a)} = {v(val)}" for a, val in w.set]
    if sets:
        parts.append("SET " + ", ".join(sets))
    if w.remove:
        parts.append("REMOVE " + ", ".join(n(a) for a in w.remove))
    if w.incr:
        one = v(1)
        parts.append("ADD " + ", ".join(f"{n(a)} {one}" for a in w.incr))
    kw: dict[str, Any] = {"Key": key_av(w.key), "UpdateExpression": " ".join(parts)}
    if conds:
        kw["ConditionExpression"] = " AND ".join(conds)
    if names:
        kw["ExpressionAttributeNames"] = names
    if values:
        kw["ExpressionAttributeValues"] = values
    return kw
