"""The one error type of the config layer."""

from __future__ import annotations

from typing import Any, Optional


class ConfigError(ValueError):
  """A config value is wrong. The message names the file (`source`: or '<dict>',
  '--set'), the dotted `field` ('server.beta_2'), the `value` and what is
  `allowed`, so that the user can fix it without reading code."""

  def __init__(self, source: str, field: str, problem: str, *,
               value: Any = None, allowed: Optional[str] = None):
    self.source, self.field, self.value, self.allowed = source, field, value, allowed
    message = f"{source}: {field or '<top level>'}: {problem}"
    if value is not None:
      shown = repr(value)
      message += f" (got {shown[:200] + '...' if len(shown) > 200 else shown})"
    if allowed:
      message += f"; allowed: {allowed}"
    super().__init__(message)
