"""The two errors of the sweep layer: a wrong sweep file, and a sweep that cannot
start or continue."""

from __future__ import annotations

from tff_fedadamom.config.errors import ConfigError


class SweepConfigError(ConfigError):
  """A sweep file is wrong; `ConfigError`'s message and attributes, `source`
  the sweep file (or '<dict>'), `field` e.g. 'space.server.beta_2.low'."""


class SweepError(RuntimeError):
  """A sweep cannot start or continue (directory in use, nothing to resume, ...)."""
