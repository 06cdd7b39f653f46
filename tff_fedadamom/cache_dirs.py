"""Where tff-fedadamom keeps what it can rebuild, a folder per kind (`processes`,
`data`), each movable by an environment variable of its own:

    $XDG_CACHE_HOME/tff-fedadamom/<kind>   (else ~/.cache/tff-fedadamom/<kind>)
"""

from __future__ import annotations

import os


def directory(kind: str, env: str) -> str:
  """`$<env>` if set, else the user's cache folder's `tff-fedadamom/<kind>`."""
  if os.environ.get(env):
    return os.environ[env]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "tff-fedadamom", kind)
