"""The one 'did you mean' helper behind every unknown-name error of the project."""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Optional


def closest(word: Any, valid: Iterable[str]) -> Optional[str]:
  """The valid name closest to `word`, or None when none is close."""
  matches = difflib.get_close_matches(str(word), [str(v) for v in valid], n=1, cutoff=0.6)
  return matches[0] if matches else None


def did_you_mean(word: Any, valid: Iterable[str]) -> str:
  """" Did you mean 'x'?" for the closest valid name, or "" when none is close."""
  match = closest(word, valid)
  return f" Did you mean '{match}'?" if match else ""
