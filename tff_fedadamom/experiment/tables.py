"""CSV and Markdown tables: the one writer behind metrics.csv repairs, `compare`
tables and sweep leaderboards.

The text is returned, not written: callers write it atomically
(`tff_fedadamom.atomic_io`).
"""

from __future__ import annotations

import csv
import io
from typing import Any, Callable, Iterable, Mapping, Sequence

# The csv module's own line ending. metrics.csv (written by TFF's
# CSVFileReleaseManager) and `compare.csv` use it; sweep tables end lines with "\n".
CRLF = "\r\n"


def columns(rows: Iterable[Mapping[str, Any]]) -> list[str]:
  """Every key of `rows`, in order of first appearance."""
  return list(dict.fromkeys(k for row in rows for k in row))


def csv_rows(header: Sequence[str], rows: Iterable[Sequence[Any]], *,
             lineterminator: str = CRLF) -> str:
  """CSV text of a header and rows of cells."""
  buffer = io.StringIO()
  writer = csv.writer(buffer, lineterminator=lineterminator)
  writer.writerow(header)
  writer.writerows(rows)
  return buffer.getvalue()


def csv_table(rows: Sequence[Mapping[str, Any]], *, lineterminator: str = CRLF) -> str:
  """CSV text of dict rows: one column per key (`columns`), None as an empty cell."""
  fields = columns(rows)
  return csv_rows(fields, ([("" if row.get(f) is None else row[f]) for f in fields]
                           for row in rows), lineterminator=lineterminator)


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]],
                   cell: Callable[[Any], str] = str) -> str:
  """A Markdown table, one line per row, each line ending in a newline; `cell`
  formats each value."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
  return "\n".join(lines) + "\n"
