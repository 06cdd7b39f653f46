"""`lru.lru_get`, `lru_put`: least-recently-used order, and what eviction spares."""

import collections

from tff_fedadamom.lru import lru_get, lru_put


def test_get_marks_an_entry_used_and_misses_give_none():
  entries = collections.OrderedDict(a=1, b=2)
  assert lru_get(entries, "a") == 1 and list(entries) == ["b", "a"]
  assert lru_get(entries, "c") is None and list(entries) == ["b", "a"]


def test_put_evicts_the_least_recently_used_not_kept_else_the_least_recently_used():
  entries = collections.OrderedDict()
  for key in "abc":
    lru_put(entries, key, key.upper(), max_size=3)
  lru_put(entries, "d", "D", max_size=3)
  assert list(entries) == ["b", "c", "d"]            # a: least recently used
  lru_put(entries, "e", "E", max_size=3, keep={"b", "d"})
  assert list(entries) == ["b", "d", "e"]            # c: the oldest not kept
  lru_put(entries, "f", "F", max_size=2, keep={"b", "d", "e"})
  assert list(entries) == ["e", "f"]                 # all kept: the oldest go
  lru_put(entries, "e", "E2", max_size=1, keep={"f"})
  assert entries == {"e": "E2"}                      # the new value stays, f goes
