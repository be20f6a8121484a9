"""nbgrader configuration for students: Validate checks a notebook the way the course grades it.

Loaded by ``nbgrader validate`` and by nbgrader's Validate button whenever this folder is the Jupyter
configuration folder (``make lab`` sets ``JUPYTER_CONFIG_DIR`` to it). A test cell fails validation only
if it raises an error; warnings, log messages and printed or displayed values do not count, as in
grading (``course_lib.grading.validate``). On a JupyterHub, put the same lines into the students'
``nbgrader_config.py`` (for example ``/etc/jupyter/nbgrader_config.py``).
"""

import os
import sys

c = get_config()  # noqa: F821  (nbgrader injects get_config when it loads this file)

try:
    import course_lib  # noqa: F401
except ImportError:  # the checkout's course_lib, two folders up, when the environment does not have it
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from course_lib.grading.validate import configure_validate  # noqa: E402

configure_validate(c)
