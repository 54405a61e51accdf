"""Email templates: lookup order, escaping, optional variables, errors, and the birthday email."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, cast

import jinja2
import pytest
from support import ROOT

from batchrun import Job
from batchrun.errors import BatchrunError, ConfigError, TemplateError
from batchrun.mail.base import Message
from batchrun.templates import DEFAULTS, Rendered, Templates, job_folder

JOB_DIR = ROOT / "batchrun" / "jobs" / "birthday" / "templates"
CODE = "ABCD-EFGH-JKLM-NPQR"
SUBJECT = "Happy birthday! A gift card for you"
REQUIRED: dict[str, Any] = {
    "first_name": "Ada",
    "last_name": "Lovelace",
    "code": CODE,
    "year": 2025,
}
OPTIONAL: dict[str, Any] = {
    "brand": "Example Shop",
    "redeem_url": f"https://shop.example.com/redeem?code={CODE}&src=email",
    "postal_address": "Example Shop Ltd\n1 Main Street, Springfield",
    "unsubscribe_url": "https://shop.example.com/unsubscribe/tok123",
    "send_year": 2026,  # batchrun sets it: the year the email goes out, not the card's
}
ALL = {**REQUIRED, **OPTIONAL}
NONE_SET = {**REQUIRED, **dict.fromkeys(OPTIONAL)}


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return folder


@pytest.fixture
def birthday() -> Templates:
    return Templates([JOB_DIR, DEFAULTS])


class Document(HTMLParser):
    """The parts of an HTML document these tests look at."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.doctype = ""
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.title = ""
        self.hidden = ""  # text inside display:none elements (the preheader)
        self.visible: list[str] = []  # body text outside them, in order
        self._open: list[str] = []
        self._hidden_depth = 0

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if tag in ("meta", "br"):
            return
        self._open.append(tag)
        if self._hidden_depth or "display:none" in (attributes.get("style") or "").replace(" ", ""):
            self._hidden_depth += 1

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1] == tag:
            self._open.pop()
            if self._hidden_depth:
                self._hidden_depth -= 1

    def handle_data(self, data: str) -> None:
        if "title" in self._open:
            self.title += data
        elif self._hidden_depth:
            self.hidden += data
        elif "body" in self._open and data.strip():
            self.visible.append(data.strip())

    def first(self, tag: str) -> dict[str, str | None]:
        return next(attrs for name, attrs in self.tags if name == tag)

    def names(self) -> list[str]:
        return [name for name, _ in self.tags]


def parse(html: str) -> Document:
    document = Document()
    document.feed(html)
    document.close()
    return document


# -- the birthday email ---------------------------------------------------------------------


def test_every_optional_variable_set(birthday: Templates) -> None:
    rendered = birthday.render("birthday", ALL)
    assert rendered.subject == SUBJECT
    assert rendered.text.startswith("Happy birthday, Ada!\n\n")
    assert rendered.text.endswith("\n")
    for expected in (
        CODE,
        "Example Shop",
        f"Redeem it here: {OPTIONAL['redeem_url']}",
        "Example Shop Ltd\n1 Main Street, Springfield",
        f"Unsubscribe: {OPTIONAL['unsubscribe_url']}",
    ):
        assert expected in rendered.text
    assert rendered.html is not None
    document = parse(rendered.html)
    links = {attrs["href"]: attrs for name, attrs in document.tags if name == "a"}
    assert set(links) == {OPTIONAL["redeem_url"], OPTIONAL["unsubscribe_url"]}
    assert "Example Shop Ltd<br>1 Main Street, Springfield" in rendered.html
    assert "© 2026 Example Shop" in document.visible  # the send year, not the period's
    assert document.visible[0] == "Happy birthday, Ada!"
    assert CODE in document.visible


def test_the_text_footer_keeps_a_blank_line_before_the_unsubscribe_line(
    birthday: Templates,
) -> None:
    lines = birthday.render("birthday", ALL).text.splitlines()
    address = lines.index("1 Main Street, Springfield")
    assert lines[address + 1] == ""
    assert lines[address + 2].startswith("You get this email once a year, in the month of")
    alone = birthday.render("birthday", {**ALL, "postal_address": None}).text.splitlines()
    assert alone[alone.index("--") + 1].startswith("You get this email once a year")


def test_the_copy_fits_a_monthly_run(birthday: Templates) -> None:
    rendered = birthday.render("birthday", ALL)
    assert rendered.html is not None
    for part in (rendered.text, rendered.html):
        assert "on your birthday" not in part and "wonderful day" not in part
        assert "Your birthday is this month" in part


@pytest.mark.parametrize("variables", [REQUIRED, NONE_SET], ids=["absent", "none"])
def test_every_optional_variable_unset(birthday: Templates, variables: dict[str, Any]) -> None:
    rendered = birthday.render("birthday", variables)
    assert rendered.subject == SUBJECT
    assert rendered.html is not None
    for part in (rendered.text, rendered.html):
        assert CODE in part
        assert "None" not in part
        assert "Unsubscribe" not in part
        assert "Redeem" not in part
        assert "Enter the code at checkout" in part
        assert "Example Shop" not in part
        assert "©" not in part and "&copy;" not in part
    document = parse(rendered.html)
    assert not [attrs for name, attrs in document.tags if name == "a"]
    assert rendered.text.rstrip().endswith("Enjoy your birthday.")


@pytest.mark.parametrize("first_name", [None, ""])
def test_no_first_name_greets_there(birthday: Templates, first_name: str | None) -> None:
    rendered = birthday.render("birthday", {**ALL, "first_name": first_name})
    assert rendered.text.splitlines()[0] == "Happy birthday, there!"
    assert rendered.html is not None
    assert parse(rendered.html).visible[0] == "Happy birthday, there!"


@pytest.mark.parametrize("variables", [ALL, REQUIRED], ids=["all", "required"])
def test_html_is_a_full_document(birthday: Templates, variables: dict[str, Any]) -> None:
    rendered = birthday.render("birthday", variables)
    assert rendered.html is not None
    document = parse(rendered.html)
    assert document.doctype.lower() == "doctype html"
    names = document.names()
    assert names[:2] == ["html", "head"]
    assert names.index("head") < names.index("title") < names.index("body")
    assert document.first("html")["lang"] == "en"
    metas = [attrs for name, attrs in document.tags if name == "meta"]
    assert {"charset": "utf-8"} in metas
    assert any(meta.get("name") == "viewport" for meta in metas)
    assert document.title == SUBJECT
    assert document.hidden.strip()  # the preheader
    assert "script" not in names and "img" not in names
    assert "<table" in rendered.html  # table layout, which mail clients render
    assert len(rendered.html.encode()) < 6000


@pytest.mark.parametrize("variables", [ALL, REQUIRED], ids=["all", "required"])
def test_code_is_not_near_the_top(birthday: Templates, variables: dict[str, Any]) -> None:
    rendered = birthday.render("birthday", {**variables, "first_name": "Al"})
    assert rendered.html is not None
    for part in (rendered.text, rendered.html):
        assert CODE in part
        assert CODE not in part[:100]
    document = parse(rendered.html)
    assert CODE not in document.hidden
    assert CODE not in rendered.text.splitlines()[0]
    assert CODE not in document.visible[0]


def test_text_and_html_say_the_same(birthday: Templates) -> None:
    rendered = birthday.render("birthday", ALL)
    assert rendered.html is not None
    document = parse(rendered.html)
    for sentence in (
        "Happy birthday, Ada!",
        "Your birthday is this month, and everyone at Example Shop wishes you a wonderful one.",
        "To celebrate, here is a gift card for you.",
        "Your gift card code:",
        "Redeem it here",
        "Enjoy your birthday.",
        "You get this email once a year, in the month of your birthday.",
    ):
        assert sentence in rendered.text
        assert sentence in " ".join(document.visible)


def test_hostile_name_is_escaped_in_html_only(birthday: Templates) -> None:
    hostile = '<script>alert("x")</script>'
    rendered = birthday.render("birthday", {**ALL, "first_name": hostile, "brand": "A & B"})
    assert rendered.html is not None
    assert "<script>" not in rendered.html
    assert "&lt;script&gt;" in rendered.html
    assert "A &amp; B" in rendered.html
    assert "script" not in parse(rendered.html).names()
    assert rendered.text.startswith(f"Happy birthday, {hostile}!")
    assert "everyone at A & B wishes" in rendered.text
    assert rendered.subject == SUBJECT


def test_rendered_parts_go_into_a_message(birthday: Templates) -> None:
    rendered = birthday.render("birthday", ALL)
    assert rendered.html is not None
    message = Message(
        sender="Example Shop <birthday@example.com>",
        to_addr="ada@example.com",
        to_name="Ada Lovelace",
        subject=rendered.subject,
        text=rendered.text,
        html=rendered.html,
        message_id="<birthday.2025.42@example.com>",
    ).to_email()
    assert message["Subject"] == SUBJECT
    text_part = message.get_body(("plain",))
    html_part = message.get_body(("html",))
    assert text_part is not None and html_part is not None
    assert text_part.get_content().replace("\r\n", "\n") == rendered.text
    assert html_part.get_content().replace("\r\n", "\n") == rendered.html


# -- the renderer ---------------------------------------------------------------------------


def test_override_wins_over_the_job_and_the_job_over_the_defaults(tmp_path: Path) -> None:
    override = write(tmp_path / "override", {"birthday/subject.txt": "Cheers, {{ first_name }}"})
    defaults = write(
        tmp_path / "defaults",
        {
            "birthday/subject.txt": "from the defaults",
            "birthday/body.txt": "from the defaults",
            "layout.html": "<p>{% block content %}{% endblock %}</p>",
        },
    )
    job_only = Templates([JOB_DIR, defaults]).render("birthday", ALL)
    assert job_only.subject == SUBJECT
    assert job_only.text.startswith("Happy birthday, Ada!")
    # the job's body.html extends the first layout.html found: here the fake defaults'
    assert job_only.html is not None
    assert job_only.html.startswith("<p><h1")

    overridden = Templates([override, JOB_DIR, defaults]).render("birthday", ALL)
    assert overridden.subject == "Cheers, Ada"
    assert overridden.text == job_only.text  # the parts the override lacks still come from the job


def test_override_can_replace_the_layout(tmp_path: Path, birthday: Templates) -> None:
    layout = "<!DOCTYPE html><html><body>{% block content %}{% endblock %}</body></html>"
    override = write(tmp_path, {"layout.html": layout})
    rendered = Templates([override, JOB_DIR, DEFAULTS]).render("birthday", ALL)
    assert rendered.html is not None
    assert rendered.html.startswith("<!DOCTYPE html><html><body><h1")
    assert rendered.text == birthday.render("birthday", ALL).text


def test_a_jobs_templates_search_override_then_job_folder_then_defaults(tmp_path: Path) -> None:
    class Here(Job):
        name = "here"

    class Elsewhere(Job):
        name = "elsewhere"
        templates = tmp_path / "mine"

    class Relative(Job):
        name = "relative"
        templates = "emails"

    tests = Path(__file__).resolve().parent
    assert job_folder(Here) == tests / "templates"
    assert job_folder(Here()) == tests / "templates"
    assert job_folder(Relative) == tests / "emails"
    assert templates_of(Elsewhere()).search == (tmp_path / "mine", DEFAULTS)
    (tmp_path / "o").mkdir()  # an override that is no folder is refused (below)
    assert templates_of(Elsewhere(), override=tmp_path / "o").search == (
        tmp_path / "o",
        tmp_path / "mine",
        DEFAULTS,
    )
    with pytest.raises(ConfigError, match="no such folder"):
        templates_of(Elsewhere(), override=tmp_path / "nowhere")
    write(tmp_path / "mine", {"hi/subject.txt": "Hi {{ who }}", "hi/body.txt": "Hello {{ who }}\n"})
    assert templates_of(Elsewhere()).render("hi", {"who": "you"}) == Rendered(
        subject="Hi you", text="Hello you\n", html=None
    )


def templates_of(job: Job, override: Path | None = None) -> Templates:
    """The templates a runtime gives ``job`` (``--templates`` as ``override``)."""
    from batchrun.runtime import Runtime
    from batchrun.settings import Settings

    settings = Settings(templates_dir=str(override) if override else None)
    return Runtime(job, cast(Any, None), None, None, settings).effects.templates(job)


def test_missing_template_names_the_folders_searched(tmp_path: Path) -> None:
    templates = Templates([tmp_path / "override", JOB_DIR, DEFAULTS])
    with pytest.raises(TemplateError) as caught:
        templates.render("renewal", REQUIRED)
    message = str(caught.value)
    assert "\n" not in message
    assert "renewal/subject.txt" in message
    for folder in templates.search:
        assert str(folder) in message
    assert isinstance(caught.value, ConfigError)
    assert isinstance(caught.value, BatchrunError)
    with pytest.raises(TemplateError, match=r"renewal/subject\.txt"):
        templates.load("renewal")


def test_missing_body_txt_is_an_error_but_body_html_is_optional(tmp_path: Path) -> None:
    write(tmp_path, {"a/subject.txt": "A", "b/subject.txt": "B", "b/body.txt": "only text\n"})
    templates = Templates([tmp_path])
    with pytest.raises(TemplateError, match=r"no email template a/body\.txt in "):
        templates.render("a", {})
    assert templates.render("b", {}) == Rendered(subject="B", text="only text\n", html=None)


def test_missing_layout_names_the_template_that_needs_it(tmp_path: Path) -> None:
    templates = Templates([JOB_DIR, tmp_path])  # no defaults folder: no layout.html
    with pytest.raises(TemplateError) as caught:
        templates.render("birthday", ALL)
    assert str(caught.value) == (
        f"no email template layout.html (needed by birthday/body.html) in {JOB_DIR}, {tmp_path}"
    )


def test_a_typo_in_a_variable_is_a_clear_error(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "t/subject.txt": "Hi",
            "t/body.txt": "{% if brand %}{{ brand }}{% endif %}Hello {{ frist_name }}\n",
        },
    )
    with pytest.raises(TemplateError) as caught:
        Templates([tmp_path]).render("t", {"first_name": "Ada"})
    assert str(caught.value) == "email template t/body.txt: 'frist_name' is undefined"
    assert isinstance(caught.value.__cause__, jinja2.UndefinedError)


def test_a_missing_required_birthday_variable_is_an_error(birthday: Templates) -> None:
    without_code = {k: v for k, v in ALL.items() if k != "code"}
    with pytest.raises(TemplateError, match=r"birthday/body\.txt: 'code' is undefined"):
        birthday.render("birthday", without_code)


def test_a_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    write(tmp_path, {"t/subject.txt": "Hi", "t/body.txt": "line one\n{% if %}\n"})
    with pytest.raises(TemplateError, match=r"^email template t/body\.txt:2: ") as caught:
        Templates([tmp_path]).render("t", {})
    assert "\n" not in str(caught.value)


def test_subject_is_one_line_and_text_is_not_escaped(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "t/subject.txt": "  Hello\n  {{ name }}\r\n and <friends>\n\n",
            "t/body.txt": "{{ name }} & <co>\n",
            "t/body.html": "<p>{{ name }}</p>",
        },
    )
    rendered = Templates([tmp_path]).render("t", {"name": "Tom & <Jerry>"})
    assert rendered.subject == "Hello Tom & <Jerry> and <friends>"
    assert rendered.text == "Tom & <Jerry> & <co>\n"
    assert rendered.html == "<p>Tom &amp; &lt;Jerry&gt;</p>"


def test_bodies_see_the_rendered_subject(tmp_path: Path) -> None:
    write(tmp_path, {"t/subject.txt": "For {{ who }}\n", "t/body.txt": "[{{ subject }}]"})
    assert Templates([tmp_path]).render("t", {"who": "you"}).text == "[For you]"


def test_each_template_is_compiled_once(
    monkeypatch: pytest.MonkeyPatch, birthday: Templates
) -> None:
    loaded: list[str] = []
    get_source: Callable[..., Any] = jinja2.FileSystemLoader.get_source

    def counting(self: jinja2.FileSystemLoader, env: jinja2.Environment, name: str) -> Any:
        loaded.append(name)
        return get_source(self, env, name)

    monkeypatch.setattr(jinja2.FileSystemLoader, "get_source", counting)
    first = birthday.render("birthday", ALL)
    assert sorted(loaded) == [
        "birthday/body.html",
        "birthday/body.txt",
        "birthday/subject.txt",
        "layout.html",
    ]
    second = birthday.render("birthday", REQUIRED)
    third = birthday.render("birthday", ALL)
    assert len(loaded) == 4
    assert third == first != second


def test_load_compiles_ahead_of_rendering(
    monkeypatch: pytest.MonkeyPatch, birthday: Templates
) -> None:
    birthday.load("birthday")
    monkeypatch.setattr(jinja2.FileSystemLoader, "get_source", None)  # any load would fail
    assert birthday.render("birthday", REQUIRED).subject == SUBJECT


@pytest.mark.slow
def test_wheel_carries_the_templates(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("batchrun-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        str(path.relative_to(ROOT))
        for folder in (DEFAULTS, JOB_DIR)
        for path in folder.rglob("*")
        if path.is_file()
    }
    assert "batchrun/default_templates/layout.html" in expected
    assert "batchrun/jobs/birthday/templates/birthday/body.html" in expected
    assert expected <= names


def test_load_finds_a_missing_layout_before_any_render(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match=r"layout\.html \(needed by birthday/body\.html\)"):
        Templates([JOB_DIR, tmp_path]).load("birthday")
    write(tmp_path, {"layout.html": "{% include 'parts/footer.html' %}"})
    with pytest.raises(TemplateError, match=r"parts/footer\.html \(needed by layout\.html\)"):
        Templates([JOB_DIR, tmp_path]).load("birthday")
    write(tmp_path, {"parts/footer.html": "{% if %}"})
    with pytest.raises(TemplateError, match=r"^email template parts/footer\.html:1: "):
        Templates([JOB_DIR, tmp_path]).load("birthday")
