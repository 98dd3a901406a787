"""Sphinx configuration of envmgr's documentation site.

Build it from the repository root (warnings are errors, broken references fail)::

    python -m sphinx -W -n docs docs/_build/html

Pages are MyST Markdown; the API reference is autodoc over ``envmgr.__all__`` and the
public subpackages, with Google-style docstrings read by napoleon.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's envmgr, not another installed copy

from sphinx.util.nodes import make_refnode  # noqa: E402

import envmgr  # noqa: E402

project = "envmgr"
author = "envmgr's authors"
copyright = "envmgr's authors, MIT License"
release = envmgr.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options: dict[str, object] = {}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# No network at build time: references to other projects' objects stay plain text, and
# nitpicky mode is told which outside names those are (the rest must resolve here).
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}
nitpick_ignore_regex = [
    (r"py:.*", r"(gymnasium|gym|numpy|np|ray|stable_baselines3|pettingzoo|torch)\b.*"),
    (r"py:.*", r"(multiprocessing|collections|typing|os|pathlib|types|concurrent|warnings)\b.*"),
    (r"py:.*", r"(Any|Callable|Sequence|Mapping|Iterable|Iterator|Path|Self|TypeVar|T)"),
    (r"py:class", r"(ActType|ObsType|RenderFrame|ArrayLike|NDArray|.*\.T|np\.ndarray)"),
]

html_theme = "furo"
html_title = "envmgr"
html_static_path = ["_static"]
html_show_sourcelink = False

# The internal layers are not in the reference (their names may change): a public class's
# base, a type hint or a docstring that names one of their objects stays plain text. Any
# other reference that does not resolve fails the build.
INTERNAL = ("frontend", "backends", "protocol", "envside", "managers", "cli")
nitpick_ignore_regex += [(r"py:.*", rf"envmgr\.({'|'.join(INTERNAL)}|\w+\._\w+)\b.*")]


def _is_internal(target: str) -> bool:
    """Whether ``target`` (dotted or bare) names an object of one of envmgr's internal
    modules, or of a private module, rather than of the public surface."""
    name = target.rsplit(".", 1)[-1]
    for module_name, module in list(sys.modules.items()):
        parts = module_name.split(".")
        internal = len(parts) > 1 and (
            parts[1] in INTERNAL or any(p.startswith("_") for p in parts)
        )
        if parts[0] == "envmgr" and internal and name in vars(module):
            return True
    return False


def _is_type_variable(target: str) -> bool:
    """Whether ``target`` names a type variable or alias of a public module (never documented)."""
    module_name, _, name = target.rpartition(".")
    module = sys.modules.get(module_name)
    obj = getattr(module, name, None) if module is not None else None
    kinds = ("TypeVar", "_GenericAlias", "UnionType", "_UnionGenericAlias", "TypeAliasType")
    return type(obj).__name__ in kinds


def _defined_in_envmgr(target: str) -> bool:
    """Whether ``target``'s last name is an object some envmgr module defines: a real name
    that the reference leaves out (a module's helper), as against a typo, which fails."""
    name = target.rsplit(".", 1)[-1]
    return any(
        module_name.split(".")[0] == "envmgr" and name in vars(module)
        for module_name, module in list(sys.modules.items())
    )


def _resolve_loosely(app, env, node, contnode):  # type: ignore[no-untyped-def]
    """A Python reference Sphinx could not resolve: to the one documented object whose full
    name ends with it, else plain text for a real envmgr name left out of the reference."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    objects = env.get_domain("py").objects
    found = [full for full in objects if full.endswith("." + target.lstrip(".~"))]
    if len(found) == 1:
        entry = objects[found[0]]
        return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode)
    if _is_internal(target) or _is_type_variable(target) or _defined_in_envmgr(target):
        return contnode
    return None


def setup(app):  # type: ignore[no-untyped-def]
    app.connect("missing-reference", _resolve_loosely)


# Gymnasium's own docstrings, inherited by the methods envmgr overrides, name its attributes.
nitpick_ignore = [("py:attr", "action_space")]
html_favicon = "_static/favicon.png"
