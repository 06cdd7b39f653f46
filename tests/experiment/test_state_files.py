"""`resume.ArrayStateManager`: TFF's file manager storing each version as
one `.npz` file, written whole or not at all, still reading TFF's SavedModels."""

import asyncio
import os

import numpy as np
import pytest
import tensorflow_federated as tff

from tff_fedadamom.experiment import resume


def _manager(root, **kwargs) -> resume.ArrayStateManager:
  return resume.ArrayStateManager(str(root), prefix="round_", **kwargs)


def _arrays(scale: float) -> list:
  return [np.arange(6, dtype=np.float32).reshape(2, 3) * scale, np.array(7, np.int64),
          np.array([scale], np.float64), np.zeros((0,), np.int32)]


def _assert_same(got, want) -> None:
  assert len(got) == len(want)
  for a, b in zip(got, want):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)


def test_a_version_loads_bit_for_bit_and_retention_is_tffs(tmp_path):
  manager = _manager(tmp_path, keep_total=2, keep_first=False)
  for version in (1, 2, 3):
    asyncio.run(manager.save(_arrays(version), version))
  assert asyncio.run(manager.get_versions()) == [2, 3]
  _assert_same(asyncio.run(manager.load(3, _arrays(0))), _arrays(3))
  assert os.listdir(tmp_path / "round_3") == [resume.ARRAYS_FILE]
  with pytest.raises(tff.program.ProgramStateNotFoundError):
    asyncio.run(manager.load(1, _arrays(0)))
  with pytest.raises(tff.program.ProgramStateExistsError):
    asyncio.run(manager.save(_arrays(0), 3))


def test_a_save_that_fails_midway_leaves_no_version(tmp_path, monkeypatch):
  manager = _manager(tmp_path)
  asyncio.run(manager.save(_arrays(1), 1))

  def killed(path, *arrays):
    with open(path, "wb") as f:
      f.write(b"PK\x03\x04 half a file")
    raise KeyboardInterrupt

  monkeypatch.setattr(resume.np, "savez", killed)
  with pytest.raises(KeyboardInterrupt):
    asyncio.run(manager.save(_arrays(2), 2))
  assert sorted(os.listdir(tmp_path)) == ["round_1"]
  assert asyncio.run(manager.get_versions()) == [1]


def test_what_a_killed_save_left_is_not_a_version_and_goes_at_the_next_save(tmp_path):
  manager = _manager(tmp_path)
  left = tmp_path / f"{resume.PARTIAL_PREFIX}round_2-0123"
  left.mkdir()
  (left / resume.ARRAYS_FILE).write_bytes(b"PK\x03\x04")
  assert asyncio.run(manager.get_versions()) is None
  asyncio.run(manager.save(_arrays(2), 2))
  assert sorted(os.listdir(tmp_path)) == ["round_2"]


def test_a_version_saved_by_tffs_own_manager_loads(tmp_path):
  """Run directories of earlier versions hold SavedModels: they still resume."""
  tff_manager = tff.program.FileProgramStateManager(str(tmp_path), prefix="round_")
  asyncio.run(tff_manager.save(_arrays(4)[:3], 4))
  manager = _manager(tmp_path)
  assert asyncio.run(manager.get_versions()) == [4]
  _assert_same(asyncio.run(manager.load(4, _arrays(0)[:3])), _arrays(4)[:3])


@pytest.mark.parametrize("damage", ["other count", "truncated", "emptied", "no file"])
def test_a_damaged_or_foreign_version_raises(tmp_path, damage):
  manager = _manager(tmp_path)
  asyncio.run(manager.save(_arrays(1), 1))
  path = tmp_path / "round_1" / resume.ARRAYS_FILE
  like = _arrays(0)
  if damage == "other count":
    like = like[:-1]
  elif damage == "truncated":
    path.write_bytes(path.read_bytes()[:40])
  elif damage == "emptied":
    path.write_bytes(b"")
  else:
    path.unlink()
  with pytest.raises(Exception) as raised:
    asyncio.run(manager.load(1, like))
  assert not isinstance(raised.value, tff.program.ProgramStateNotFoundError)
  if damage in ("other count", "no file"):
    assert isinstance(raised.value, ValueError)


def test_a_state_that_is_not_a_list_is_refused_by_name(tmp_path):
  with pytest.raises(TypeError, match="program_state must be a list or tuple"):
    asyncio.run(_manager(tmp_path).save({"weights": np.zeros(2)}, 1))
  assert asyncio.run(_manager(tmp_path).get_versions()) is None
