"""The two errors of the sweep layer: a wrong sweep file, and a sweep that cannot
start or continue."""

from __future__ import annotations

from tff_fedadamom.config.errors import ConfigError


class SweepConfigError(ConfigError):
  """A sweep file is wrong. The message names the file, the field, the value and
  what is allowed.

  Attributes:
    source: The sweep file (or '<dict>').
    field: Dotted path of the field, e.g. 'space.server.beta_2.low'.
    value: The offending value (None when not applicable).
    allowed: What is allowed, in words.
  """


class SweepError(RuntimeError):
  """A sweep cannot start or continue (directory in use, nothing to resume, ...)."""
