"""Templates rendered once per shape and filled in: the same text as Jinja's own render,
for every kind of use of a variable, and the ordinary render wherever that is not sure."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from markupsafe import Markup
from support import ROOT

from batchrun.errors import TemplateError
from batchrun.template_shapes import MAX_SHAPES, Shapes
from batchrun.templates import DEFAULTS, Templates

BIRTHDAY = ROOT / "batchrun" / "jobs" / "birthday" / "templates"

# Values of every kind a job passes: set and unset texts, texts that need escaping,
# numbers (0 and 1 print differently, and True prints "True"), Markup, a list.
VALUES: list[Any] = [
    "Ada",
    "Zoë 🎂",
    'Tom & "Jerry" <b>',
    "{braces} {0}",
    "",
    None,
    0,
    7,
    1.5,
    True,
    False,
    Markup("<i>kept</i>"),
    ["x", "y"],
]

# One template per use of a variable; a, b and c are the variables.
SOURCES = {
    "printed": "Hi {{ a }}, {{ b }}!",
    "or": "Hi {{ a or 'there' }} / {{ a or b }} / {{ a and b }}",
    "if": "{% if a %}A{{ a }}{% elif b %}B{% else %}none{% endif %}",
    "not-and": "{% if not a and b %}no a, but {{ b }}{% endif %}{{ not c }}",
    "cond": "{{ a if b else c }}|{{ 'yes' if a else 'no' }}",
    "filters": "{{ a | upper }} {{ a | length }} {{ a | default('d') }} {{ b | e }}",
    "compare": "{% if a == 'Ada' %}Ada!{% endif %}{{ b is number }}{{ a in ['Ada'] }}",
    "index": "{{ a[0] }} {{ b.x }}",
    "loop": "{% for ch in a %}[{{ ch }}]{% endfor %}{% for i in range(2) %}{{ b }}{% endfor %}",
    "set": "{% set x = a %}{{ x }} {% set a = 'shadow' %}{{ a }}",
    "with": "{% with y = a %}{{ y }}{% endwith %}",
    "autoescape-off": "{% autoescape false %}{{ a }}{% endautoescape %}{{ a }}",
    "literal-braces": "{{ '{0}' }} {{ a }} {{ '{' }}",
    "repeated": "{{ a }}{{ a }}{{ b }}{{ a }}",
}


def _templates(tmp_path: Path, html: str, text: str = "{{ a }}\n") -> Templates:
    folder = tmp_path / "job"
    (folder / "mail").mkdir(parents=True, exist_ok=True)
    (folder / "mail" / "subject.txt").write_text("Subject {{ a }}\n", encoding="utf-8")
    (folder / "mail" / "body.txt").write_text(text, encoding="utf-8")
    (folder / "mail" / "body.html").write_text(html, encoding="utf-8")
    return Templates([folder, DEFAULTS])


def _ordinary(templates: Templates) -> Templates:
    """The same templates, every part rendered the ordinary way."""
    ordinary = Templates(templates.search)
    ordinary._shapes_of = lambda template: None  # type: ignore[method-assign]
    return ordinary


def _outcome(templates: Templates, variables: dict[str, Any]) -> Any:
    """The render, or the error it raised (a missing variable printed, len() of a number)."""
    try:
        return templates.render("mail", variables)
    except (TemplateError, TypeError) as exc:
        return (type(exc), str(exc))


@pytest.mark.parametrize("name", list(SOURCES))
def test_every_use_of_a_variable_renders_as_jinja_does(tmp_path: Path, name: str) -> None:
    shaped = _templates(tmp_path, SOURCES[name], text=SOURCES[name] + "\n")
    ordinary = _ordinary(shaped)
    pick = random.Random(name)
    for _ in range(300):
        variables = {v: pick.choice(VALUES) for v in "abc" if pick.random() < 0.9}
        assert _outcome(shaped, variables) == _outcome(ordinary, variables), variables


def test_the_birthday_email_renders_as_jinja_does_and_mostly_from_skeletons() -> None:
    shaped = Templates([BIRTHDAY, DEFAULTS])
    ordinary = _ordinary(shaped)
    calls = 0
    render_each = shaped._render_each

    def counted(template: Any, namespace: dict[str, Any]) -> str:
        nonlocal calls
        calls += 1
        return render_each(template, namespace)

    shaped._render_each = counted  # type: ignore[method-assign]
    pick = random.Random(3)
    for n in range(400):
        variables = {
            "first_name": pick.choice(["Ada", "Zoë", "O'Brien & <Sons>", "", f"N{n}"]),
            "last_name": "Lovelace",
            "code": f"ABCD-EFGH-{n:04d}",
            "year": 2025,
            "brand": pick.choice(["Example Shop", None]),
            "redeem_url": pick.choice([f"https://shop.example.com/r?code={n}&src=mail", None]),
            "postal_address": "Example Shop Ltd\n1 Main Street",
            "unsubscribe_url": f"https://shop.example.com/unsubscribe/tok{n}",
            "send_year": 2026,
        }
        assert shaped.render("birthday", variables) == ordinary.render("birthday", variables)
    shapes = [s for s in shaped._shapes.values() if s is not None]
    assert len(shapes) == 3 and not any(s.broken for s in shapes)
    # Two ordinary renders for each shape's first message (its text, its skeleton); the
    # shapes here: a name set or not, a brand or not, a redeem URL or not.
    assert calls <= 2 * sum(len(s._skeletons) for s in shapes) <= 2 * 3 * 8


def test_an_include_keeps_its_own_escaping(tmp_path: Path) -> None:
    shaped = _templates(tmp_path, '{{ a }} {% include "mail/part.txt" %}')
    (tmp_path / "job" / "mail" / "part.txt").write_text("[{{ a }}]", encoding="utf-8")
    ordinary = _ordinary(shaped)
    for a in ("x & y", "<b>", "plain"):
        html = shaped.render("mail", {"a": a}).html
        assert html == ordinary.render("mail", {"a": a}).html
    assert html is not None and "<b>" in ordinary.render("mail", {"a": "<b>"}).html  # type: ignore[operator]


def test_super_in_a_child_block_renders_as_jinja_does(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    (folder / "mail").mkdir(parents=True)
    (folder / "base.html").write_text("<p>{% block b %}base {{ a }}{% endblock %}</p>")
    shaped = _templates(
        tmp_path, '{% extends "base.html" %}{% block b %}child {{ b }} {{ super() }}{% endblock %}'
    )
    ordinary = _ordinary(shaped)
    for a, b in (("1", "2"), ("<x>", ""), ("", None)):
        assert shaped.render("mail", {"a": a, "b": b}) == ordinary.render("mail", {"a": a, "b": b})
    assert any(s is not None and s._skeletons for s in shaped._shapes.values())


@pytest.mark.parametrize(
    "source",
    [
        "{% set x %}{{ a }}{% endset %}{{ x | length }}",
        "{% filter upper %}{{ a }}{% endfilter %}",
        "{% macro m() %}{{ a }}{% endmacro %}{{ m() | length }}",
        "{{ [a, 'b', 'c'] | random }}",
        "{{ lipsum(1) }} {{ a }}",
        "{% include c %}",
    ],
)
def test_a_template_that_could_change_its_text_renders_the_ordinary_way(
    tmp_path: Path, source: str
) -> None:
    shaped = _templates(tmp_path, source)
    (tmp_path / "job" / "x").write_text("included {{ b }}")
    ordinary = _ordinary(shaped)
    for a in ("x", "a longer value"):
        variables = {"a": a, "b": "B", "c": "x"}
        got = shaped.render("mail", variables).html
        if "random" not in source and "lipsum" not in source:
            assert got == ordinary.render("mail", variables).html
    html = [t for t in shaped._shapes if t.name == "mail/body.html"]
    assert [shaped._shapes[t] for t in html] == [None]


def test_a_variable_used_any_other_way_is_part_of_the_shape(tmp_path: Path) -> None:
    shaped = _templates(tmp_path, "{{ a | upper }} {{ b }} {% if c %}c{% endif %}{{ a }}")
    shaped.render("mail", {"a": "x", "b": "y", "c": "z"})
    (html,) = [s for t, s in shaped._shapes.items() if t.name == "mail/body.html"]
    assert html is not None
    assert html.slots == ("b", "c") and html.structural == ("a",)


def test_past_the_shapes_it_keeps_a_template_still_renders_right(tmp_path: Path) -> None:
    shaped = _templates(tmp_path, "{{ a | upper }} {{ b }}")
    ordinary = _ordinary(shaped)
    for n in range(MAX_SHAPES + 10):
        variables = {"a": f"value {n}", "b": f"b{n}"}
        assert shaped.render("mail", variables) == ordinary.render("mail", variables)
    assert all(s is None or len(s._skeletons) <= MAX_SHAPES for s in shaped._shapes.values())


def test_a_skeleton_that_would_differ_is_never_used() -> None:
    # A render that is not a function of its variables alone (a counter here): the
    # first message's filled-in skeleton differs from its text, and from then on every
    # message is rendered the ordinary way.
    count = 0

    def render(namespace: dict[str, Any]) -> str:
        nonlocal count
        count += 1
        return f"#{count} {namespace['a']}"

    shapes = Shapes(("a",), (), render)
    assert [shapes.render({"a": name}) for name in ("x", "y", "z")] == ["#1 x", "#3 y", "#4 z"]
    assert shapes.broken and not shapes._skeletons
