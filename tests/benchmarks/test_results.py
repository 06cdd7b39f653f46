"""The benchmarks' pure parts: RESULTS.md's sections, the ratios, the sweep
benchmark's shortening and table, and that `make bench` runs every script."""

import os
import re

import pytest

from benchmarks import common, rounds, sweeps

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = ("# Title\n\nintro\n\n<!-- begin: a -->\nold a\n<!-- end: a -->\n\nbetween\n\n"
        "<!-- begin: b -->\nold b\n<!-- end: b -->\ntail\n")


def test_replace_section_rewrites_only_its_block():
  new = common.replace_section(TEXT, "a", "new a\nline 2\n")
  assert new == TEXT.replace("old a", "new a\nline 2")
  new = common.replace_section(new, "b", "new b")
  assert new.split("<!-- begin: b -->")[0] == TEXT.replace("old a", "new a\nline 2").split(
      "<!-- begin: b -->")[0]
  assert "new b\n<!-- end: b -->\ntail\n" in new and "old" not in new


def test_replace_section_appends_a_missing_block():
  new = common.replace_section(TEXT, "c", "c body")
  assert new.startswith(TEXT.rstrip("\n"))
  assert new.endswith("\n\n<!-- begin: c -->\nc body\n<!-- end: c -->\n")
  assert common.replace_section("", "c", "x") == "<!-- begin: c -->\nx\n<!-- end: c -->\n"


@pytest.mark.parametrize("text", [
    "<!-- begin: a -->\nno end\n",
    "<!-- end: a -->\n<!-- begin: a -->\n",
    "<!-- begin: a -->\n<!-- end: a -->\n<!-- begin: a -->\n<!-- end: a -->\n",
])
def test_replace_section_refuses_a_broken_block(text):
  with pytest.raises(ValueError, match="section 'a'"):
    common.replace_section(text, "a", "x")


def test_a_section_name_is_checked():
  with pytest.raises(ValueError, match="allowed are lowercase"):
    common.replace_section(TEXT, "a -->", "x")


def test_write_section_makes_the_file_and_keeps_the_other_sections(tmp_path):
  path = str(tmp_path / "RESULTS.md")
  common.write_section("one", "One", "figures 1", path)
  common.write_section("two", "Two", "figures 2", path)
  common.write_section("one", "One", "figures 1b", path)
  text = open(path).read()
  assert text.startswith(common.HEADER)
  assert text.index("figures 1b") < text.index("figures 2") and "figures 1\n" not in text
  one = text.split("<!-- begin: one -->")[1].split("<!-- end: one -->")[0]
  assert one.startswith("\n## One\n\ncommit ")
  assert re.search(r"cores, load average [\d.]+ at the end; \d{4}-\d\d-\d\d \d\d:\d\d UTC", one)
  assert os.listdir(tmp_path) == ["RESULTS.md"]  # no temporary file left


def test_ratios_and_missing_figures():
  assert common.ratio(6.0, 2.0) == 3.0
  assert common.ratio(None, 2.0) is None and common.ratio(1.0, 0.0) is None
  # The median of the per-pair ratios, not the ratio of the medians.
  assert common.paired_ratio([2.0, 9.0, 4.0], [1.0, 3.0, 1.0]) == 3.0
  assert common.paired_ratio([], []) is None
  with pytest.raises(ValueError):
    common.paired_ratio([1.0], [1.0, 2.0])
  assert common.fmt(None) == common.NOT_MEASURED and common.fmt(2.345) == "2.35"
  assert common.goal(2.5, 2.5) == "met" and common.goal(2.4, 2.5) == "NOT met"
  assert common.goal(1.1, 1.0, at_least=False) == "NOT met"
  assert common.goal(None, 1.0) == common.NOT_MEASURED


def test_interleaved_times_every_call_and_rotates_the_first():
  order = []
  times = common.interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                             repeats=2, warmups=1)
  assert order == ["a", "b", "a", "b", "b", "a"]
  assert {k: len(v) for k, v in times.items()} == {"a": 2, "b": 2}


def test_sweep_table_ratio_and_what_was_not_measured():
  body = sweeps.section({"quickstart": {"trials": 20, "rounds": 6, "concurrent": 2,
                                        "cold": 90.0, "warm": 40.0, "separate": 120.0}})
  quick = next(line for line in body.splitlines() if line.startswith("| `configs/sweeps/quick"))
  cells = [c.strip() for c in quick.strip("|").split("|")]
  assert cells[1:] == ["20 trials x 6 rounds, 2 at a time", "90.0", "40.0", "120.0", "2.25",
                       "3.00 (met)"]
  fmnist = next(line for line in body.splitlines() if line.startswith("| `configs/sweeps/fmn"))
  assert fmnist.count(common.NOT_MEASURED) == 6
  slow = sweeps.section({"quickstart": {"trials": 20, "rounds": 6, "concurrent": 2,
                                        "cold": 90.0, "warm": 60.0, "separate": 120.0}})
  assert "2.00 (NOT met)" in slow


def test_round_table_marks_configs_not_run():
  times = {"logistic": {"floor": [0.01, 0.01], "inprocess": [0.05, 0.03],
                        "ray": [0.1, 0.1], "tff_cpp": [0.2, 0.4], "async0": [0.05, 0.03],
                        "async": [0.06, 0.06]}}
  lines = rounds.round_table(times).splitlines()
  # async / inprocess: the median of the paired ratios 0.06 / 0.05 and 0.06 / 0.03.
  assert lines[2] == ("| logistic | 10.0 | 40.0 | 100.0 | 300.0 | 40.0 | 60.0 | 4.00 | 10.00 | "
                      "30.00 | 4.00 | 6.00 | 1.00 | 1.60 |")
  assert all(line.count(common.NOT_MEASURED) == 13 for line in lines[3:])
  assert len(lines) == 2 + len(rounds.CONFIGS)


def test_prepare_gives_the_shortened_sweeps_and_their_separate_runs(tmp_path):
  from tff_fedadamom.config import load_config
  from tuning import schema

  for name, (sweep_file, values) in sweeps.SWEEPS.items():
    cache = {"base.runtime.cache_dir": str(tmp_path / "cache")}
    path = os.path.join(common.ROOT, sweep_file)
    info = sweeps.prepare(path, {**values, **cache}, str(tmp_path / name),
                          separate=name == "quickstart")
    # The --set overrides the tune command gets give the sweep exactly these values.
    raw = schema.sweep_to_dict(schema.load_sweep(path, info["overrides"]))
    for dotted, value in {**values, **cache}.items():
      section, *keys = dotted.split(".")
      node = raw[section]
      for key in keys:
        node = node[key]
      assert node == value, (name, dotted)
    assert len(info["runs"]) == (info["trials"] if name == "quickstart" else 0)
    for run in info["runs"]:
      assert load_config(run).runtime.threads == 1
