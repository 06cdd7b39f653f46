"""Where a compiled computation's calls ran, recorded by a test."""


def record_devices(computation) -> dict:
  """Counts the calls of `computation` (a `tf_computation.TFComputation`) per
  device from now on; returns the live {device: calls} dict.

  Wraps the instance's `call_flat_leaves`, so it records what the backend asks
  for: `device_index` picks a device as the computation does, round-robin over
  the devices it was built for.
  """
  used: dict = {}
  devices = computation._devices  # noqa: SLF001 - the list the computation chooses from
  call = computation.call_flat_leaves

  def recorded(leaves, device_index=0):
    device = devices[device_index % len(devices)]
    used[device] = used.get(device, 0) + 1
    return call(leaves, device_index)

  computation.call_flat_leaves = recorded
  return used
