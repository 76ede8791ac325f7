# GENERATED from chapters/00_runtime.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/00_runtime.md § Growing a class across cells
"""Helpers of the book, not of the engine: a class grown across cells, numbers glued into prose."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["add_to_class", "glue"]

T = TypeVar("T")


# %% chapters/00_runtime.md § Growing a class across cells
def add_to_class(cls: type):
    """Decorator: attach a function (or property, staticmethod, classmethod) to ``cls``.

    ``@add_to_class(Manager)`` above ``def step(self): ...`` makes ``Manager.step``
    exist from then on, for instances made before and after.
    """

    def attach(member):
        function = (getattr(member, "fget", None) or getattr(member, "__func__", None)
                    or member)
        name = function.__name__
        setattr(cls, name, member)
        if hasattr(member, "__set_name__"):  # e.g. functools.cached_property
            member.__set_name__(cls, name)
        return member

    return attach


# %% chapters/00_runtime.md § Numbers in the prose come from the code
def glue(name: str, value: T, display: bool = False) -> T:
    """Hand ``value`` to the prose, where ``{glue:text}`` shows it by name; return it.

    Without myst-nb (Colab, a plain Jupyter) the value is shown if ``display`` is true.
    A NumPy or torch scalar is glued as the plain Python number it holds, so a format
    spec in the prose (``:.1f`` after the name) works on it.
    """
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        plain = value.item()
    else:
        plain = value
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        if display:
            from IPython.display import display as show

            show(value)
        return value
    myst_glue(name, plain, display=display)
    return value
