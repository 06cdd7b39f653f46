"""Figures: matplotlib's object API, saved atomically; the one way the project draws.
No pyplot and no backend switch (a `Figure` renders with Agg when saved), so
drawing changes nothing process-wide and needs no display."""

from __future__ import annotations

import io
import os
from typing import Optional

from tff_fedadamom.atomic_io import atomic_write_bytes

DPI = 110


def new_figure(*, figsize, ncols: int = 1, nrows: int = 1, squeeze: bool = True,
               gridspec_kw: Optional[dict] = None):
  """A matplotlib `Figure` and its axes (`Figure.subplots`)."""
  from matplotlib.figure import Figure

  fig = Figure(figsize=figsize)
  return fig, fig.subplots(nrows, ncols, squeeze=squeeze, gridspec_kw=gridspec_kw)


def margins_in_inches(fig, *, left: float = 0.8, right: float = 0.2, bottom: float = 0.55,
                      top: float = 0.45, wspace: float = 0.25, hspace: float = 0.45) -> None:
  """Fixed margins around the axes, in inches, instead of `tight_layout`, which
  measures every tick label first (slow on a sweep's many axes). The defaults
  fit a y label, tick labels of up to 6 characters and a title."""
  width, height = fig.get_size_inches()
  fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height,
                      top=1 - top / height, wspace=wspace, hspace=hspace)


def save_figure(fig, path: str | os.PathLike, dpi: float = DPI) -> str:
  """Saves `fig` atomically, as `path`'s extension says (png without one); returns `path`."""
  path = os.fspath(path)
  buffer = io.BytesIO()
  fig.savefig(buffer, format=os.path.splitext(path)[1].lstrip(".") or "png", dpi=dpi)
  atomic_write_bytes(path, buffer.getvalue())
  return path
