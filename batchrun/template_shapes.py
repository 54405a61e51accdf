"""A template rendered once for each shape of its variables, then filled in per message.

Most of a birthday email is the same for every user: the layout, the styles, the footer.
Only a few variables (a name, a code, an unsubscribe URL) differ, and a template usually
prints them as they are (``{{ code }}``) or only asks whether they are set
(``{% if redeem_url %}``, ``{{ first_name or "there" }}``). For such a variable, the
text around it depends on whether it is set, not on its value. ``Shapes`` finds those
variables by reading the template's syntax tree (and the trees of what it extends,
includes or imports); every other variable is *structural*: its value decides the text.

A *shape* is the set of slot variables that are set, and the values of everything else.
The first message of each shape is rendered with a stand-in for each set slot variable;
the stand-in tells, where it lands, whether Jinja escaped it (``__html__``) or printed it
(``__str__``). What is left is the constant text between the slots. Later messages of
that shape are the constant text joined with their own values, escaped where the
template escapes: no Jinja context, no block calls, no per-node escaping.

Safety: a variable used in any other way (a filter, a comparison, an attribute, a loop,
an argument, assigned or shadowed anywhere) is structural, so its value is in the shape.
The first message of each shape is also rendered the ordinary way, and a template whose
filled-in text ever differs is rendered the ordinary way from then on. A template with a
name computed at render time (``{% include name %}``), a block that captures output
(``{% set %}…{% endset %}``, ``{% filter %}``, a macro or call block), ``self`` or
``caller``, something random (``| random``, ``lipsum()``), or more than ``MAX_SHAPES``
shapes, is rendered the ordinary way too, as is a message with a value that is not of
a plain immutable type (``_VALUES``): a list, an object of the job's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import jinja2.meta
import jinja2.nodes as nodes
from markupsafe import Markup, escape

MAX_SHAPES = 32  # per template; past that, new shapes render the ordinary way
_MISSING = object()  # a variable the message does not give
_SET = object()  # a slot variable that is set (truthy): its value is filled in
# The values a shape is made of: immutable, so a shape's text cannot go stale. A message
# with a value of another type (a list, an object of the job's) renders the ordinary way.
_VALUES = frozenset({str, int, float, bool, type(None), Markup, Decimal, date, datetime, object})
_MARK = re.compile("\x00([ht])(\\d+)\x00")
# Nodes whose output a template can capture and change ({% set x %}...{% endset %}, a
# filter block, a macro or call block): a template with one renders the ordinary way.
_CAPTURING = (nodes.AssignBlock, nodes.FilterBlock, nodes.Macro, nodes.CallBlock)


class _StandIn:
    """What a set slot variable is rendered with: it leaves a mark where Jinja prints it,
    ``h`` where it was escaped (autoescaped HTML), ``t`` where it was printed as text."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __html__(self) -> str:
        return f"\x00h{self.index}\x00"

    def __str__(self) -> str:
        return f"\x00t{self.index}\x00"


def _escaped(value: str | int) -> str:
    """``escape(value)`` as Jinja's autoescape prints it; a text with nothing to escape
    (most names and codes) is returned as it is, without a Markup copy."""
    if type(value) is str and (
        "&" in value or "<" in value or ">" in value or "'" in value or '"' in value
    ):
        return str(escape(value))
    return str(value)


@dataclass(frozen=True, slots=True)
class _Skeleton:
    """A shape's text: its constant pieces, with a hole (None) where a slot variable is
    printed, and for each hole its position, the variable's index and whether it is
    escaped there."""

    pieces: list[str | None]
    holes: tuple[tuple[int, int, bool], ...]

    def fill(self, values: list[Any]) -> str:
        pieces = self.pieces.copy()
        for position, index, escaped in self.holes:
            value = values[index]
            pieces[position] = _escaped(value) if escaped else str(value)
        return "".join(pieces)  # type: ignore[arg-type]  # every hole is filled


class Shapes:
    """The skeletons of one template, by shape.

    Args:
        slots: the slot variables, in a fixed order.
        structural: every other name the template reads.
        render: the ordinary render of the template, given a namespace.
    """

    def __init__(
        self,
        slots: tuple[str, ...],
        structural: tuple[str, ...],
        render: Callable[[dict[str, Any]], str],
    ) -> None:
        self.slots = slots
        self.structural = structural
        self._render = render
        self._skeletons: dict[tuple[Any, ...], _Skeleton] = {}
        self._missing = (_MISSING,) * len(structural)
        self.broken = False  # a filled-in text differed from the ordinary render

    def render(self, namespace: dict[str, Any]) -> str:
        """The template's text for ``namespace``, from its shape's skeleton if it can."""
        if self.broken:
            return self._render(namespace)
        get = namespace.get
        values = [get(name, _MISSING) for name in self.slots]
        key: list[Any] = [
            _SET if (type(value) is str or type(value) is int) and value else (type(value), value)
            for value in values
        ]
        key += [(type(value), value) for value in map(get, self.structural, self._missing)]
        if not all(part is _SET or part[0] in _VALUES for part in key):
            return self._render(namespace)
        skeleton = self._skeletons.get(shape := tuple(key))
        if skeleton is not None:
            return skeleton.fill(values)
        return self._first(shape, values, namespace)

    def _first(self, shape: tuple[Any, ...], values: list[Any], namespace: dict[str, Any]) -> str:
        """The first message of a shape: the ordinary render, and the skeleton beside it."""
        text = self._render(namespace)
        if len(self._skeletons) >= MAX_SHAPES:
            return text
        stand_ins = dict(namespace)
        for index, name in enumerate(self.slots):
            if shape[index] is _SET:
                stand_ins[name] = _StandIn(index)
        skeleton = _skeleton(self._render(stand_ins))
        if skeleton is None or skeleton.fill(values) != text:
            self.broken = True
        else:
            self._skeletons[shape] = skeleton
        return text


def _skeleton(marked: str) -> _Skeleton | None:
    """The skeleton in a render with stand-ins; None if its text holds a NUL of its own."""
    split = _MARK.split(marked)
    texts = split[0::3]
    if any("\x00" in text for text in texts):
        return None
    pieces: list[str | None] = [texts[0]]
    holes = []
    for mode, index, text in zip(split[1::3], split[2::3], texts[1:], strict=True):
        holes.append((len(pieces), int(index), mode == "h"))
        pieces += [None, text]
    return _Skeleton(pieces, tuple(holes))


def shapes_of(
    env: jinja2.Environment,
    template: jinja2.Template,
    source: Callable[[str], str | None],
    render: Callable[[dict[str, Any]], str],
) -> Shapes | None:
    """The shapes of ``template``, or None when it cannot have any: a template it needs
    is named at render time, or ``source`` does not give its source or one it needs."""
    trees: list[nodes.Template] = []
    pending = [template.name]
    seen: set[str | None] = set(pending)
    while pending:
        name = pending.pop()
        text = source(name) if name is not None else None
        if text is None:
            return None
        tree = env.parse(text, name)
        trees.append(tree)
        for reference in jinja2.meta.find_referenced_templates(tree):
            if reference is None:
                return None
            if reference not in seen:
                seen.add(reference)
                pending.append(reference)
    for tree in trees:
        if any(True for _ in tree.find_all(_CAPTURING)):
            return None
        if any(node.name == "random" for node in tree.find_all(nodes.Filter)):
            return None  # a new pick per message, not per shape
    read: set[str] = set()
    structural: set[str] = set()
    for tree in trees:
        for name, plain in _names(tree, ()):
            if name in ("self", "caller", "lipsum") or (name == "super" and not plain):
                return None  # a block's text could be captured: self.footer() | upper
            if plain is None:
                structural.add(name)  # stored: assigned, a loop target or a parameter
            else:
                read.add(name)
                if not plain:
                    structural.add(name)
    slots = tuple(sorted(read - structural))
    return Shapes(slots, tuple(sorted(structural)), render)


def _names(node: nodes.Node, parents: tuple[nodes.Node, ...]) -> Iterator[tuple[str, bool | None]]:
    """Every name in ``node``'s tree: (name, whether only its truth or its text as it is
    reaches the output there), with None for a name that is stored (assigned, a target,
    a parameter)."""
    if isinstance(node, nodes.Name):
        yield node.name, (_plain(node, parents) if node.ctx == "load" else None)
        return
    inner = (*parents, node)
    for child in node.iter_child_nodes():
        yield from _names(child, inner)


def _plain(name: nodes.Name, parents: tuple[nodes.Node, ...]) -> bool:
    """Whether ``name`` is printed as it is (``{{ name }}``, ``{{ name or "text" }}``,
    ``{{ a if name else b }}``) or only tested for truth (``{% if name %}``,
    ``{% if not a and name %}``): climbing the tree from it, its value passes only
    through ``and``, ``or`` and the branches of ``… if … else …`` to an output, or is
    turned into its truth on the way (``not``, a test of ``if``)."""
    node: nodes.Node = name
    for parent in reversed(parents):
        if isinstance(parent, nodes.Output):
            return True
        if isinstance(parent, nodes.Not):
            return True  # a truth value: the same for every value of the shape
        if isinstance(parent, nodes.If | nodes.CondExpr) and parent.test is node:
            return True
        if isinstance(parent, nodes.And | nodes.Or | nodes.CondExpr):
            node = parent  # the value itself goes on up
            continue
        if name.name == "super" and node is name:  # {{ super() }}: the parent block's text
            return (
                isinstance(parent, nodes.Call)
                and parent.node is name
                and not (parent.args or parent.kwargs or parent.dyn_args or parent.dyn_kwargs)
                and len(parents) > 1
                and isinstance(parents[-2], nodes.Output)
            )
        return False
    return False
