"""Email templates: Jinja2, looked up in ``--templates``, then the job's folder, then ours.

``Templates(search).render("birthday", variables)`` renders ``birthday/subject.txt``,
``birthday/body.txt`` and, when there is one, ``birthday/body.html``, each from the first
folder of ``search`` that has it, so a team overrides one file and keeps the rest. The
``.html`` parts are autoescaped; the ``.txt`` parts are not. batchrun's own folder
(``DEFAULTS``) holds ``layout.html``, the document an HTML body may ``{% extends %}``.

Variables: one that was not given is false in ``{% if brand %}`` and takes
``| default(...)``, so optional variables may simply be left out; printing one raises
``TemplateError`` naming it, so a typo in a required variable cannot go out as an empty
string. ``None`` prints as nothing.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import jinja2
import jinja2.meta
import jinja2.nodes

from batchrun.errors import JobError, MissingTemplateError, TemplateError
from batchrun.template_shapes import Shapes, shapes_of

if TYPE_CHECKING:
    from batchrun.job import Job

DEFAULTS = Path(__file__).resolve().parent / "default_templates"
PARTS = ("subject.txt", "body.txt", "body.html")


@dataclass(frozen=True, slots=True)
class Rendered:
    """One rendered email: a one-line subject, the text part and the HTML part if any."""

    subject: str
    text: str
    html: str | None


class _Undefined(jinja2.StrictUndefined):
    """Raises when printed, iterated or compared, like StrictUndefined, but is false."""

    __slots__ = ()

    def __bool__(self) -> bool:  # type: ignore[override]  # StrictUndefined's raises
        return False


def _finalize(value: Any) -> Any:
    return "" if value is None else value


@dataclass(frozen=True, slots=True)
class _Compiled:
    subject: jinja2.Template
    text: jinja2.Template
    html: jinja2.Template | None


class _Loader(jinja2.FileSystemLoader):
    """Jinja2's file loader, keeping the first source it read of each template: the one
    compiled (templates are compiled once), for ``template_shapes`` to read."""

    def __init__(self, search: Sequence[Path]) -> None:
        super().__init__(search)
        self.sources: dict[str, str] = {}

    def get_source(
        self, environment: jinja2.Environment, template: str
    ) -> tuple[str, str, Callable[[], bool]]:
        source, filename, uptodate = super().get_source(environment, template)
        self.sources.setdefault(template, source)
        return source, filename, uptodate


class Templates:
    """A job's email templates, each compiled once and rendered per message.

    Args:
        search: folders in lookup order (``--templates``, the job's own folder,
            ``DEFAULTS``); folders that do not exist are skipped. ``Runtime.templates``
            builds it.
    """

    def __init__(self, search: Sequence[Path | str]) -> None:
        self.search = tuple(Path(folder) for folder in search)
        self._env = jinja2.Environment(
            loader=_Loader(self.search),
            autoescape=jinja2.select_autoescape(
                enabled_extensions=("html",), disabled_extensions=(), default=False
            ),
            undefined=_Undefined,
            finalize=_finalize,
            keep_trailing_newline=True,  # a text body ends with its newline
            trim_blocks=True,
            lstrip_blocks=True,
            # Templates do not change while a run sends: no stat per message (and no
            # eviction, for the layout an HTML body extends).
            auto_reload=False,
            cache_size=-1,
        )
        self._compiled: dict[str, _Compiled] = {}
        self._globals_keys: dict[jinja2.Template, frozenset[str]] = {}
        # Each part's skeletons by shape (None: the part renders the ordinary way).
        self._shapes: dict[jinja2.Template, Shapes | None] = {}

    def load(self, name: str) -> None:
        """Compile ``name``'s parts and the templates they extend or include, now.

        So a missing or broken template stops a run before it has done anything.
        """
        compiled = self._compiled.get(name) or self._load(name)
        parts = (compiled.subject, compiled.text, compiled.html)
        pending = [part.name for part in parts if part is not None and part.name is not None]
        seen = set(pending)
        while pending:
            path = pending.pop()
            assert self._env.loader is not None
            try:
                source = self._env.loader.get_source(self._env, path)[0]
                references = jinja2.meta.find_referenced_templates(self._env.parse(source, path))
            except jinja2.TemplateError as exc:
                self._fail(path, exc)
            for reference in references:  # None for a name computed at render time
                if reference is not None and reference not in seen:
                    seen.add(reference)
                    self._template(reference, needed_by=path)
                    pending.append(reference)

    def render(self, name: str, variables: Mapping[str, Any]) -> Rendered:
        """Render ``name/subject.txt``, ``name/body.txt`` and ``name/body.html`` if present.

        The subject is collapsed to one line; the bodies also see it as ``subject``.

        Raises:
            TemplateError: a part is missing or does not compile, or prints a variable
                that ``variables`` lacks.
        """
        compiled = self._compiled.get(name) or self._load(name)
        # One namespace for the three parts, globals merged once: what Template.render
        # would build per part is most of a part's cost.
        namespace = {**self._env.globals, **variables}
        current = PARTS[0]
        try:
            subject = " ".join(self._render(compiled.subject, namespace).split())
            namespace["subject"] = subject
            current = PARTS[1]
            text = self._render(compiled.text, namespace)
            current = PARTS[2]
            html = None if compiled.html is None else self._render(compiled.html, namespace)
        except jinja2.TemplateError as exc:
            self._fail(f"{name}/{current}", exc)
        return Rendered(subject=subject, text=text, html=html)

    def _render(self, template: jinja2.Template, namespace: dict[str, Any]) -> str:
        """``template.render(namespace)``: from the skeleton of its shape when it has one
        (``template_shapes``: rendered once per shape, filled in per message), else
        ``_render_each``."""
        try:
            shapes = self._shapes[template]
        except KeyError:
            shapes = self._shapes[template] = self._shapes_of(template)
        if shapes is None:
            return self._render_each(template, namespace)
        return shapes.render(namespace)

    def _shapes_of(self, template: jinja2.Template) -> Shapes | None:
        """The shapes of ``template``, judged on the sources it and what it needs were
        compiled from, as the loader kept them."""
        loader = self._env.loader
        if not isinstance(loader, _Loader):
            return None

        def source(name: str) -> str | None:
            if name not in loader.sources:
                self._env.get_template(name)  # compiled now, its source kept
            return loader.sources.get(name)

        try:
            return shapes_of(
                self._env, template, source, functools.partial(self._render_each, template)
            )
        except jinja2.TemplateError:
            return None  # a template it needs is missing or broken: rendering says so

    def _render_each(self, template: jinja2.Template, namespace: dict[str, Any]) -> str:
        """One ordinary render of ``template``, without copying ``namespace`` into a new dict.

        The context is what ``template.new_context(namespace, shared=True)`` builds, but
        for the names of the template's globals: Jinja2 takes ``set(template.globals)``
        (a ChainMap over the environment's globals, merged anew on every iteration) per
        context; they do not change once the template is loaded, so the set is taken once
        per template (about a fifth of a part's render).
        """
        keys = self._globals_keys.get(template)
        if keys is None:
            keys = self._globals_keys[template] = frozenset(template.globals)
        context = self._env.context_class(self._env, namespace, template.name, template.blocks)
        # Only ever read (a set difference, for {% import %}); frozen, so never changed.
        context.globals_keys = cast(set[str], keys)
        try:
            return self._env.concat(template.root_render_func(context))
        except Exception:
            self._env.handle_exception()  # re-raises, with the template's lines in the traceback

    def _load(self, name: str) -> _Compiled:
        subject = self._template(f"{name}/subject.txt")
        text = self._template(f"{name}/body.txt")
        html = self._template(f"{name}/body.html", optional=True)
        assert subject is not None and text is not None
        compiled = self._compiled[name] = _Compiled(subject, text, html)
        return compiled

    def _template(
        self, path: str, *, optional: bool = False, needed_by: str | None = None
    ) -> jinja2.Template | None:
        try:
            return self._env.get_template(path)
        except jinja2.TemplateNotFound as exc:
            if optional and exc.name == path:
                return None
            self._fail(needed_by or path, exc)
        except jinja2.TemplateError as exc:
            self._fail(path, exc)

    def _fail(self, path: str, exc: jinja2.TemplateError) -> NoReturn:
        """Raise one line naming the template, and for a missing one the folders searched."""
        if isinstance(exc, jinja2.TemplateNotFound):
            folders = ", ".join(str(folder) for folder in self.search)
            missing = exc.name if exc.name == path else f"{exc.name} (needed by {path})"
            raise MissingTemplateError(f"no email template {missing} in {folders}") from None
        where = path
        if isinstance(exc, jinja2.TemplateSyntaxError):
            where = f"{exc.name or path}:{exc.lineno}"
        reason = (exc.message or type(exc).__name__).splitlines()[0]
        raise TemplateError(f"email template {where}: {reason}") from exc


def template_names(folder: Path) -> list[str]:
    """The templates in ``folder``: its sub-folders holding a ``subject.txt`` or ``body.txt``."""
    if not folder.is_dir():
        return []
    return sorted(
        sub.name
        for sub in folder.iterdir()
        if sub.is_dir() and any((sub / part).is_file() for part in PARTS[:2])
    )


def job_folder(job: Job | type[Job]) -> Path:
    """The folder of ``job``'s templates: ``Job.templates``, relative to its module's folder.

    By default that is ``templates/`` beside the module that defines the job; a subclass
    defined elsewhere (a test's slower birthday, a team's variant) without a folder of its
    own uses its parent's.
    """
    cls = job if isinstance(job, type) else type(job)
    first: Path | None = None
    for klass in cls.__mro__:
        if klass.__module__ == "batchrun.job" or not hasattr(klass, "templates"):
            continue
        module_file = getattr(sys.modules.get(klass.__module__), "__file__", None)
        base = Path(module_file).resolve().parent if module_file else Path.cwd()
        own = klass.__dict__.get("templates")
        if own is not None:
            folder = Path(own)
            return folder if folder.is_absolute() else base / folder
        candidate = base / "templates"
        first = first or candidate
        if candidate.is_dir():
            return candidate
    return first or Path.cwd() / "templates"


def compile_job(templates: Templates, job: Job, folder: Path | None, override: str | None) -> None:
    """Compile every template of ``job``: those in its folder (``folder``, else its own)
    and, in ``override`` (``--templates``), one named after the job; with what they
    extend or include. A dry run does it too.

    Raises:
        JobError: a template is missing a part or does not compile (one line, exit 1).
    """
    names = set(template_names(folder or job_folder(job)))
    if override is not None and job.name in template_names(Path(override)):
        names.add(job.name)
    for name in sorted(names):
        try:
            templates.load(name)
        except TemplateError as exc:
            raise JobError(f"job {job.name!r}: {exc}") from exc


__all__ = [
    "DEFAULTS",
    "Rendered",
    "TemplateError",
    "Templates",
    "compile_job",
    "job_folder",
    "template_names",
]
