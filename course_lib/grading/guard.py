"""Kernel-side guard: undo what student code did to the interpreter before each test cell runs.

The grader sends :data:`INSTALL` once per kernel, right after start and before any notebook cell, and
:data:`RESTORE` (silently, not stored in the history) before each part of a test cell. ``INSTALL``
records the interpreter's state; ``RESTORE`` puts it back:

* IPython event callbacks (``pre_run_cell``, ``post_run_cell``...) registered since, except the
  matplotlib inline backend's own; AST transformers and input transformers;
* ``sys.displayhook``/``sys.excepthook``, trace and profile functions (``sys``/``threading``);
* every attribute of ``builtins``, ``math``, ``cmath``, ``operator``, ``numpy`` and ``numpy.testing``
  (a patched ``math.isclose`` or ``numpy.allclose``);
* the methods of IPython's shell, display hook and kernel classes (a patched ``run_cell`` or
  ``showtraceback``), including per-instance overrides.

This is defence in depth, not a proof: code running in the kernel can still undo the guard. The
pre-grading screen (:mod:`course_lib.grading.screen`) holds any submission that touches these
internals for manual review, and grades come from errors only (:mod:`course_lib.grading.execute`).
"""

from __future__ import annotations

import secrets

__all__ = ["install_code", "restore_code"]

_INSTALL_TEMPLATE = r"""
def _grading_guard_install():
    import builtins, cmath, math, operator, sys, threading, types
    try:
        import numpy, numpy.testing
        modules = [builtins, math, cmath, operator, numpy, numpy.testing]
    except ImportError:
        modules = [builtins, math, cmath, operator]
    ip = get_ipython()
    classes = []
    for obj in (ip, ip.displayhook, getattr(ip, "kernel", None)):
        if obj is not None:
            classes += [c for c in type(obj).__mro__ if c is not object]
    saved = {
        "events": {name: list(cbs) for name, cbs in ip.events.callbacks.items()},
        "ast": list(ip.ast_transformers),
        "post": list(ip.input_transformers_post),
        "cleanup": list(ip.input_transformer_manager.cleanup_transforms),
        "line": list(ip.input_transformer_manager.line_transforms),
        "modules": [(m, dict(vars(m))) for m in modules],
        "classes": [(c, dict(vars(c))) for c in classes],
        "instances": [
            (o, {k: v for k, v in vars(o).items() if callable(v)})
            for o in (ip, ip.displayhook, getattr(ip, "kernel", None))
            if o is not None
        ],
        "displayhook": sys.displayhook,
        "excepthook": sys.excepthook,
    }

    def allowed(callback):
        module = getattr(callback, "__module__", "") or ""
        return module.startswith("matplotlib_inline.")

    def restore():
        for name, callbacks in ip.events.callbacks.items():
            keep = saved["events"].get(name, [])
            callbacks[:] = keep + [cb for cb in callbacks if cb not in keep and allowed(cb)]
        ip.ast_transformers[:] = saved["ast"]
        ip.input_transformers_post[:] = saved["post"]
        ip.input_transformer_manager.cleanup_transforms[:] = saved["cleanup"]
        ip.input_transformer_manager.line_transforms[:] = saved["line"]
        sys.settrace(None)
        sys.setprofile(None)
        threading.settrace(None)
        threading.setprofile(None)
        sys.displayhook = saved["displayhook"]
        sys.excepthook = saved["excepthook"]
        for module, attrs in saved["modules"]:
            for key, value in attrs.items():
                if vars(module).get(key, attrs) is not value:
                    setattr(module, key, value)
        for cls, attrs in saved["classes"]:
            for key, value in attrs.items():
                if isinstance(value, (types.FunctionType, staticmethod, classmethod, property)):
                    if vars(cls).get(key) is not value:
                        setattr(cls, key, value)
        for obj, before in saved["instances"]:
            methods = {k for c in type(obj).__mro__ for k, v in vars(c).items() if callable(v)}
            for key in [k for k in vars(obj) if k in methods]:
                if key not in before:
                    delattr(obj, key)
                elif vars(obj)[key] is not before[key]:
                    setattr(obj, key, before[key])

    sys.modules[__MODULE__] = types.SimpleNamespace(restore=restore)


_grading_guard_install()
del _grading_guard_install
"""


def _module_name() -> str:
    return "_grading_guard_" + secrets.token_hex(8)


#: One random module name per grading process, so student code cannot name it in advance.
MODULE_NAME = _module_name()


def install_code(module_name: str = MODULE_NAME) -> str:
    """Python source that records the kernel's state under ``sys.modules[module_name]``."""
    return _INSTALL_TEMPLATE.replace("__MODULE__", repr(module_name))


def restore_code(module_name: str = MODULE_NAME) -> str:
    """Python source that restores the state :func:`install_code` recorded (raises if it is gone)."""
    return f"__import__('sys').modules[{module_name!r}].restore()"
