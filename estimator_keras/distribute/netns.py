"""One private network namespace, with only loopback, for a local cluster's tasks.

TensorFlow's gRPC servers bind every interface and run any graph they are
sent, unauthenticated. Processes inside a network namespace of their own that
has only ``lo`` can reach each other on 127.0.0.1, and nothing outside it can
reach them: neither other machines nor this machine's own network namespace.

:func:`create` makes such a namespace (a plain network namespace where this
process may, else a user namespace that maps only the caller's own uid and gid
plus a network namespace), brings ``lo`` up, and returns a :class:`Namespace`
that holds it open by file descriptors; :meth:`Namespace.wrap` turns a task's
command into one that enters the namespace and then ``exec``s the command, so
the task keeps the process id, process group, pipes and signals its launcher
gave it, and is killed by the kernel should its launcher die (SIGKILL
included). Without TensorFlow and without extra programs: the helper steps run
this file with the same Python (``python -I netns.py hold|enter``) and only
the standard library (``os.unshare``/``os.setns`` on Python 3.12+, libc
through ctypes before).

Example::

    try:
        namespace = netns.create()
    except netns.NamespaceUnavailable as e:
        print("no private network:", e)
    else:
        with namespace:
            proc = subprocess.Popen(namespace.wrap(command), pass_fds=namespace.fds)
"""

import contextlib
import errno
import os
import select
import signal
import subprocess
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWUTS = 0x04000000

# <linux/prctl.h>
PR_SET_PDEATHSIG = 1

# <linux/sockios.h>, <net/if.h>
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

# Seconds for the helper to report (one Python start-up, a few system calls).
CREATE_TIMEOUT = 20.0


class NamespaceUnavailable(RuntimeError):
    """A private network namespace cannot be made here; the message says why."""


def _libc_call(name, *args):
    import ctypes  # pylint: disable=import-outside-toplevel  (only without os.unshare/os.setns)
    try:
        function = ctypes.CDLL(None, use_errno=True)[name]
    except AttributeError as e:
        raise OSError(errno.ENOSYS, f"this system has no {name}()") from e
    if function(*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _unshare(flags):
    if hasattr(os, "unshare"):
        os.unshare(flags)
    else:
        _libc_call("unshare", flags)


def _setns(fd, nstype):
    if hasattr(os, "setns"):
        os.setns(fd, nstype)
    else:
        _libc_call("setns", fd, nstype)


def _write(path, text):
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def loopback_up():
    """Brings the network namespace's ``lo`` up (a new one starts with it down)."""
    import fcntl  # pylint: disable=import-outside-toplevel
    import socket  # pylint: disable=import-outside-toplevel
    import struct  # pylint: disable=import-outside-toplevel
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", b"lo", 0)  # struct ifreq: name, flags
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def _why(call, error):
    hints = {
        errno.EPERM: "not permitted: this process may not create network namespaces, and the "
                     "kernel or a security policy (kernel.unprivileged_userns_clone=0, AppArmor's "
                     "kernel.apparmor_restrict_unprivileged_userns=1, a container's seccomp "
                     "profile) forbids unprivileged user namespaces",
        errno.ENOSPC: "the namespace limit is reached (/proc/sys/user/max_user_namespaces or "
                      "max_net_namespaces is 0 or used up)",
        errno.EINVAL: "this kernel has no user or network namespaces",
        errno.ENOSYS: "this kernel has no user or network namespaces",
        errno.EUSERS: "user namespaces are nested too deeply",
    }
    return f"{call} failed: {hints.get(error.errno, error.strerror or error)}"


def _hold():
    """The helper process: makes the namespaces, reports on stdout, waits for stdin to close."""
    uid, gid = os.geteuid(), os.getegid()
    try:
        _unshare(CLONE_NEWNET)
        kind = "net"
    except OSError as first:
        try:
            _unshare(CLONE_NEWUSER | CLONE_NEWNET)
            kind = "user"
        except OSError as second:
            print("fail", _why("unshare(CLONE_NEWNET)", first) + "; " +
                  _why("unshare(CLONE_NEWUSER | CLONE_NEWNET)", second), flush=True)
            return 1
    try:
        if kind == "user":
            # Only the caller's own ids, so that the tasks keep their uid and gid.
            _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
            _write("/proc/self/setgroups", "deny\n")
            _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
        loopback_up()
    except OSError as e:
        print("fail", f"setting up the new namespace failed: {e}", flush=True)
        return 1
    print("ok", kind, flush=True)
    # Hold the namespaces until the launcher has opened them (or is gone).
    sys.stdin.buffer.read()
    return 0


def die_with_parent(ignore=()):
    """A ``Popen`` ``preexec_fn`` that asks the kernel to SIGKILL the child
    when its parent dies: what a launcher starts must not outlive a launcher
    killed outright. The signals in ``ignore`` stay ignored in the child
    (through exec): a helper that its parent waits for finishes its work
    when a signal reaches their whole process group (Ctrl-C, a tuner's
    SIGTERM), and the parent decides what stops. libc is loaded here, before
    the fork, so the child only makes the call. Best effort; None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # pylint: disable=import-outside-toplevel
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec():
        for signum in ignore:
            signal.signal(signum, signal.SIG_IGN)
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)

    return preexec


def die_with(parent_pid):
    """Called first thing in a helper that its parent started with no
    ``preexec_fn`` (a parent with threads, JAX's for one, must not run Python
    between fork and exec): the kernel SIGKILLs this process when its parent
    dies; a parent already gone ends it now. Best effort; nothing off Linux."""
    if not sys.platform.startswith("linux"):
        return
    try:
        _libc_call("prctl", PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except OSError:
        return
    if os.getppid() != parent_pid:
        os._exit(125)  # pylint: disable=protected-access  (no cleanup of a parent's helper)


@contextlib.contextmanager
def stop_signals_held():
    """Holds SIGTERM, SIGINT and SIGHUP in the calling thread while it starts
    a child of a session of its own. Until that child calls setsid it is in
    this process's group, and subprocess resets its handlers to the default
    there: a signal sent to the group meanwhile (tune stopping a trial just as
    it exports) would kill it. A child started here keeps the three held, so
    the signals this process handles never end it; it ends with this process
    (:func:`die_with`). This thread's own mask comes back on leaving; a
    signal sent meanwhile reaches this process once they are released."""
    held = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _name_host_localhost():
    """Gives the task a host name of its own, "localhost": what binds to the
    address the host name resolves to (JAX's gloo collectives) must find it
    here, where only loopback exists; the machine's own name may resolve to
    an address of its network. Best effort: without it such a task fails
    to bind, and says so."""
    import socket  # pylint: disable=import-outside-toplevel
    try:
        _unshare(CLONE_NEWUTS)
        socket.sethostname("localhost")
    except OSError as e:
        print(f"warning: the task keeps this machine's host name ({e}); a program that binds "
              f"the address it resolves to may find none in the private network",
              file=sys.stderr)


def _enter(argv):
    """``enter PARENTPID USERFD|- NETFD -- COMMAND...``: join the namespaces,
    take the host name "localhost", exec the command."""
    parent, user_fd, net_fd, sep, program, *rest = argv
    if sep != "--":
        raise SystemExit(f"netns enter: expected --, got {sep!r}")
    try:
        # A launcher killed outright (SIGKILL) cannot end its tasks: the
        # kernel does. The setting survives exec.
        _libc_call("prctl", PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except OSError as e:
        print(f"warning: the task will outlive a killed launcher: prctl: {e}", file=sys.stderr)
    if os.getppid() != int(parent):
        return 125  # the launcher died before the setting took
    try:
        if user_fd != "-":
            _setns(int(user_fd), CLONE_NEWUSER)
            os.close(int(user_fd))
        _setns(int(net_fd), CLONE_NEWNET)
        os.close(int(net_fd))
    except OSError as e:
        print(f"could not enter the cluster's private network namespace: {e}", file=sys.stderr)
        return 126
    _name_host_localhost()
    try:
        os.execv(program, [program, *rest])
    except OSError as e:
        print(f"could not run {program}: {e}", file=sys.stderr)
        return 127


class Namespace:
    """A private network namespace (and its user namespace, if one was needed),
    held open by file descriptors until :meth:`close`.

    Attributes:
      user: True when a user namespace was created (an unprivileged caller).
      fds: the descriptors a task's ``Popen`` must pass on (``pass_fds``).
    """

    def __init__(self, net_fd, user_fd=None):
        self.net_fd = net_fd
        self.user_fd = user_fd
        self.user = user_fd is not None
        self.fds = tuple(fd for fd in (user_fd, net_fd) if fd is not None)

    def wrap(self, command):
        """The argument list that runs ``command`` (its program an absolute
        path) inside the namespace, as the same process."""
        user = "-" if self.user_fd is None else str(self.user_fd)
        return [sys.executable, "-I", os.path.abspath(__file__), "enter", str(os.getpid()), user,
                str(self.net_fd), "--", *command]

    def close(self):
        """Closes the descriptors; the namespace lives on while a task is in it."""
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def create(timeout=CREATE_TIMEOUT):
    """Make a private network namespace with loopback up; returns a :class:`Namespace`.

    Raises:
      NamespaceUnavailable: it cannot be made here; the message says why.
    """
    try:
        helper = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), "hold"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        raise NamespaceUnavailable(f"could not start {sys.executable}: {e}") from e
    try:
        ready, _, _ = select.select([helper.stdout], [], [], timeout)
        line = helper.stdout.readline().decode("utf-8", "replace").strip() if ready else ""
        status, _, detail = line.partition(" ")
        if status != "ok":
            if not ready:
                detail = f"its helper did not report within {timeout:g} s"
            elif not detail:
                helper.kill()
                err = helper.communicate(timeout=5)[1].decode("utf-8", "replace").strip()
                detail = "its helper failed: " + (err.splitlines()[-1] if err else
                                                  f"exit status {helper.returncode}")
            raise NamespaceUnavailable(detail)
        base = f"/proc/{helper.pid}/ns/"
        try:
            user_fd = os.open(base + "user", os.O_RDONLY | os.O_CLOEXEC) if detail == "user" \
                else None
            try:
                net_fd = os.open(base + "net", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                if user_fd is not None:
                    os.close(user_fd)
                raise
        except OSError as e:
            raise NamespaceUnavailable(f"could not open the new namespace: {e}") from e
        return Namespace(net_fd, user_fd)
    finally:
        # The descriptors hold the namespaces now; the helper can go.
        if helper.poll() is None:
            try:
                helper.stdin.close()
                helper.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                helper.kill()
        helper.wait()
        for stream in (helper.stdin, helper.stdout, helper.stderr):
            try:
                stream.close()
            except OSError:
                pass


if __name__ == "__main__":
    if sys.argv[1:2] == ["hold"]:
        sys.exit(_hold())
    if sys.argv[1:2] == ["enter"]:
        sys.exit(_enter(sys.argv[2:]))
    sys.exit("usage: netns.py hold | enter USERFD|- NETFD -- PROGRAM [ARG...]")
