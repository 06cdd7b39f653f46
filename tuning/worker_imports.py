"""What a node's trial workers import, once, in the template process they are
forked from (`tuning.hosts`): TensorFlow, TFF, the pipeline and the worker
itself (`template.WORKER_MODULES`), outside the garbage collector and frozen
out of it afterwards (`session.startup_imports`: the template is its process's
entry point).

Importing this module is the template's whole start-up; it starts no
TensorFlow runtime (no op runs, no device is listed), so each forked worker
sizes its thread pools and picks its GPUs after the fork.
"""

import importlib

from tff_fedadamom.session import startup_imports
from tuning.template import WORKER_MODULES

with startup_imports():
  for _name in WORKER_MODULES:
    importlib.import_module(_name)
