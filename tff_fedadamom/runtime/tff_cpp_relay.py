"""The child process of the `tff_cpp` backend: TFF's worker_binary in a network
namespace of its own, reachable only through a Unix socket.

TFF's worker_binary serves gRPC on `[::]:PORT`, every network interface, with
no option to choose the address (TFF's `cc/simulation/servers.cc`). In a fresh
network namespace "every interface" is that namespace's loopback alone. This
process enters a new user and network namespace (`unshare`, allowed where the
kernel allows unprivileged user namespaces) and brings its `lo` up, starts
worker_binary there with SIGKILL as its parent death signal, and relays each
connection on a Unix socket (in a directory only its user may enter) to the
worker's port on 127.0.0.1: the file system is shared, the network is not.

It prints `ready WORKER_PID` once the worker accepts connections (the probe:
`ready` once the namespace is made), or `error: ...` and exits 3. It ends, its
worker first, on SIGTERM, when the worker ends (with its status), or when its
stdin reaches end of file: the kernel closes the parent's end of that pipe
however the parent ends (a parent death signal would fire when the parent's
*thread* that started it ends). Ending, it removes its socket and directory.

Only the standard library is used: this file runs as a script.

Usage: tff_cpp_relay.py --probe
       tff_cpp_relay.py SOCKET_PATH WORKER_BINARY MAX_CONCURRENT_CALLS
"""

import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
# struct ifreq: the interface name, then (here) the flags, padded to 40 bytes.
_IFREQ = "16sH22x"
# The worker's own TensorFlow: one thread per kernel, like the parent's.
WORKER_THREADS_ENV = {"TF_NUM_INTRAOP_THREADS": "1", "OMP_NUM_THREADS": "1"}
_CHUNK = 1 << 18
_libc = ctypes.CDLL(None, use_errno=True)


def enter_private_network() -> None:
  """Moves this process into a new user and network namespace, with `lo` up.
  The user namespace (uid and gid mapped to themselves) is what lets an
  unprivileged process own the network namespace."""
  uid, gid = os.getuid(), os.getgid()
  if _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
    errno = ctypes.get_errno()
    raise OSError(errno, f"unshare(CLONE_NEWUSER | CLONE_NEWNET): {os.strerror(errno)}")
  for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                     ("gid_map", f"{gid} {gid} 1")):
    with open(f"/proc/self/{name}", "w") as f:
      f.write(text)
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    request = struct.pack(_IFREQ, b"lo", 0)
    flags = struct.unpack(_IFREQ, fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, request))[1]
    fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def _start_worker(binary: str, port: int, max_calls: str) -> subprocess.Popen:
  """worker_binary on `port`, SIGKILLed by the kernel when this process ends."""
  relay = os.getpid()

  def end_with_relay():  # runs in the child: this process has no other thread yet
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != relay:
      os._exit(1)

  return subprocess.Popen(
      [binary, f"--port={port}", f"--max_concurrent_computation_calls={max_calls}"],
      stdin=subprocess.DEVNULL, stdout=sys.stderr, preexec_fn=end_with_relay,
      env={**os.environ, **WORKER_THREADS_ENV})


def _wait_listening(worker: subprocess.Popen, port: int, timeout_s: float = 120.0) -> None:
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
      return
    except OSError:
      if worker.poll() is not None or time.monotonic() > deadline:
        raise RuntimeError(f"worker_binary did not listen on port {port} "
                           f"(exit status {worker.poll()})") from None
      time.sleep(0.02)


def _pump(source: socket.socket, sink: socket.socket) -> None:
  """Copies `source` to `sink` until end of file, then ends `sink`'s writing side."""
  with contextlib.suppress(OSError):
    while data := source.recv(_CHUNK):
      sink.sendall(data)
  for end, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
    with contextlib.suppress(OSError):
      end.shutdown(how)


def _relay(client: socket.socket, port: int) -> None:
  try:
    upstream = socket.create_connection(("127.0.0.1", port))
  except OSError:
    client.close()
    return
  upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
  back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
  back.start()
  _pump(client, upstream)
  back.join()
  client.close()
  upstream.close()


# Held by the one thread that ends this process (`_end`).
_ENDING = threading.Lock()


def _end(worker: subprocess.Popen, status: int, path: str) -> None:
  """Ends this process, its worker first (reaped here: the machine's init may
  not reap orphans), and removes the socket at `path` and its directory. A
  second caller (parent and worker gone at once) waits, so that it cannot exit
  before the first removed the directory."""
  _ENDING.acquire()  # never released: this process ends here
  worker.kill()
  worker.wait()
  # Each apart: the socket may be missing (not bound yet, or removed by the
  # parent), and its directory must go all the same.
  for remove, target in ((os.unlink, path), (os.rmdir, os.path.dirname(path))):
    with contextlib.suppress(OSError):
      remove(target)
  os._exit(status)


def serve(path: str, binary: str, max_calls: str) -> None:
  # A free port: the namespace is this process's alone, so nothing else can
  # take it before the worker does.
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  worker = _start_worker(binary, port, max_calls)
  signal.signal(signal.SIGTERM, lambda *_: _end(worker, 0, path))
  threading.Thread(target=lambda: (sys.stdin.buffer.read(), _end(worker, 0, path)),
                   daemon=True).start()
  threading.Thread(target=lambda: (worker.wait(), _end(worker, worker.returncode or 1, path)),
                   daemon=True).start()
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  listener.bind(path)
  listener.listen(16)
  _wait_listening(worker, port)
  print(f"ready {worker.pid}", flush=True)
  while True:
    client, _ = listener.accept()
    threading.Thread(target=_relay, args=(client, port), daemon=True).start()


def main(argv) -> int:
  try:
    enter_private_network()
  except OSError as e:
    print(f"error: {e}", flush=True)
    return 3
  if argv == ["--probe"]:
    print("ready", flush=True)
    return 0
  serve(*argv)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
