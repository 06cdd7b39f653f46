"""The one 'did you mean' helper behind every unknown-name error of the project."""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Optional


def closest(word: Any, valid: Iterable[str], *, by_prefix: bool = False) -> Optional[str]:
  """The valid name closest to `word` by spelling, or None when none is close;
  with `by_prefix`, also one that a word of 3+ characters starts or is started
  by ('trials' for 'trials_per_optimizer')."""
  word, valid = str(word), [str(v) for v in valid]
  matches = difflib.get_close_matches(word, valid, n=1, cutoff=0.6)
  if matches:
    return matches[0]
  if by_prefix and len(word) >= 3:
    return next((v for v in valid if v.startswith(word) or word.startswith(v)), None)
  return None


def did_you_mean(word: Any, valid: Iterable[str]) -> str:
  """" Did you mean 'x'?" for the closest valid name, or "" when none is close."""
  match = closest(word, valid)
  return f" Did you mean '{match}'?" if match else ""


def suggest(word: Any, valid: Iterable[str], *, by_prefix: bool = False) -> str:
  """", did you mean 'x'?" to append to a problem ("" when none is close)."""
  match = closest(word, valid, by_prefix=by_prefix)
  return f", did you mean '{match}'?" if match else ""
