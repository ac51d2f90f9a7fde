"""Every file the package reads or writes, local or remote, goes through here.

Local paths use ``os`` and ``shutil``; remote ones (``gs://`` and any other
scheme ``tf.io.gfile`` understands) use ``tf.io.gfile``, imported only when a
remote path is met, so that datasets, manifests and configs on local disk are
handled without loading TensorFlow. Where TensorFlow is not installed, remote
paths go through fsspec instead (gcsfs for ``gs://``; ``memory://`` is
fsspec's own in-memory file system), imported on first use.

Writes are atomic: :func:`atomic_write` and :func:`atomic_file` write to a
temporary name beside the target and rename it into place, removing the
temporary file when anything fails, so no half-written file ever sits under a
final name. :func:`swap_in` replaces a whole directory the same way.

Example::

    from estimator_keras import io

    io.atomic_write(io.join(model_dir, "config.yaml"), text)
    for name in io.listdir("gs://bucket/data"):
        ...
"""

import contextlib
import fnmatch
import functools
import glob as glob_lib
import os
import posixpath
import shutil
import types
import uuid

from estimator_keras import tf_optional
from estimator_keras.errors import UsageError

TMP_MARK = ".tmp-"
OLD_MARK = ".old-"


def _gfile():
    """The remote file system: ``tf.io.gfile``, or fsspec without TensorFlow."""
    tf = tf_optional.tensorflow()
    return tf.io.gfile if tf is not None else _FSSPEC


@functools.lru_cache(maxsize=None)
def _fsspec_module():
    try:
        import fsspec  # pylint: disable=import-outside-toplevel  (remote paths only)
    except ImportError as e:
        raise UsageError(
            "remote paths (gs://...) are read and written with TensorFlow's tf.io.gfile, or "
            "where TensorFlow is not installed with fsspec, and neither is installed: run "
            "`pip install fsspec gcsfs` (gcsfs is fsspec's gs://), or install estimator-keras "
            f"with its `jax` extra, or install TensorFlow: {tf_optional.INSTALL}.") from e
    return fsspec


class _Fsspec:
    """The calls of ``tf.io.gfile`` this module makes, on fsspec.

    fsspec names paths without their scheme; the paths handed back get the
    scheme of the path asked about again.
    """

    @staticmethod
    def _fs(path):
        path = str(path)
        try:
            return _fsspec_module().core.url_to_fs(path)[0]
        except (ImportError, ValueError) as e:
            scheme = path.split("://", 1)[0]
            raise UsageError(
                f"{path}: fsspec reads {scheme}:// paths (TensorFlow, whose tf.io.gfile "
                f"would, is not installed) but cannot here: {e}. For gs:// run `pip install "
                f"gcsfs`.") from e

    @staticmethod
    def _uri(like, path):
        return f"{str(like).split('://', 1)[0]}://{path.lstrip('/')}"

    def exists(self, path):
        return self._fs(path).exists(str(path))

    def isdir(self, path):
        return self._fs(path).isdir(str(path))

    def listdir(self, path):
        fs = self._fs(path)
        own = fs._strip_protocol(str(path)).rstrip("/")  # pylint: disable=protected-access
        return [posixpath.basename(p.rstrip("/")) for p in fs.ls(str(path), detail=False)
                if p.rstrip("/") != own]

    def glob(self, pattern):
        return [self._uri(pattern, p) for p in self._fs(pattern).glob(str(pattern))]

    def makedirs(self, path):
        self._fs(path).makedirs(str(path), exist_ok=True)

    def stat(self, path):
        fs = self._fs(path)
        try:
            mtime_nsec = int(fs.modified(str(path)).timestamp() * 1e9)
        except (NotImplementedError, AttributeError):
            mtime_nsec = 0
        return types.SimpleNamespace(length=fs.size(str(path)), mtime_nsec=mtime_nsec)

    def remove(self, path):
        self._fs(path).rm_file(str(path))

    def rmtree(self, path):
        self._fs(path).rm(str(path), recursive=True)

    def rename(self, src, dst, overwrite=False):
        src, dst = str(src), str(dst)
        if not overwrite and exists(dst):
            raise FileExistsError(f"{dst} exists")
        if is_remote(src) and is_remote(dst) and src.split("://")[0] == dst.split("://")[0]:
            self._fs(src).mv(src, dst, recursive=True)
        elif isdir(src):
            copy_tree(src, dst)
            rmtree(src)
        else:
            self.copy(src, dst)
            remove(src)

    def GFile(self, path, mode):  # pylint: disable=invalid-name  (gfile's name)
        if "b" in mode:
            return self._fs(path).open(str(path), mode)
        return self._fs(path).open(str(path), mode, encoding="utf-8")

    @staticmethod
    def copy(src, dst, overwrite=True):
        del overwrite  # a copy replaces the destination, as gfile's does with overwrite
        with open_file(src, "rb") as f_in, open_file(dst, "wb") as f_out:
            shutil.copyfileobj(f_in, f_out, 1 << 20)

    def walk(self, top):
        for folder, dirs, files in self._fs(top).walk(str(top)):
            yield self._uri(top, folder), dirs, files


_FSSPEC = _Fsspec()


def is_remote(path):
    """True for a URI with a scheme (``gs://...``), False for a local path."""
    return "://" in str(path)


def join(base, *parts):
    """``base/part/...`` with ``/`` separators, for local paths and URIs alike.

    A part that starts with ``/`` restarts the path, as ``os.path.join`` does;
    use :func:`child` for names that come from untrusted files.
    """
    return posixpath.join(str(base), *(str(p) for p in parts))


def child(directory, name, what="file name"):
    """``directory/name`` where ``name`` must stay inside ``directory``.

    For names read from manifests and configs: an absolute name, a URI, a
    ``..`` component or an empty name raises ValueError naming ``what``.
    """
    name = str(name)
    parts = name.replace("\\", "/").split("/")
    if (not name or name.startswith("/") or "://" in name or ".." in parts
            or any(p in ("", ".") for p in parts)):
        raise ValueError(f"{what} {name!r} must be a relative path inside {directory}, "
                         f"without '..', '.' or empty components")
    return join(directory, name)


def parent(path):
    """The folder holding ``path``; a bucket root is its own parent."""
    text = str(path).rstrip("/")
    if is_remote(text):
        scheme, rest = text.split("://", 1)
        if "/" not in rest:
            return text
        return f"{scheme}://{rest.rsplit('/', 1)[0]}"
    return os.path.dirname(text) or "."


def basename(path):
    return posixpath.basename(str(path).rstrip("/"))


def exists(path):
    return _gfile().exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path):
    return _gfile().isdir(path) if is_remote(path) else os.path.isdir(path)


def isfile(path):
    return exists(path) and not isdir(path)


def listdir(path):
    """Sorted entry names of a folder (without trailing slashes)."""
    if is_remote(path):
        return sorted(n.rstrip("/") for n in _gfile().listdir(str(path)))
    return sorted(os.listdir(path))


def glob(pattern):
    """Sorted paths matching a shell pattern, local or remote."""
    if is_remote(pattern):
        return sorted(_gfile().glob(str(pattern)))
    return sorted(glob_lib.glob(str(pattern)))


def makedirs(path):
    if is_remote(path):
        _gfile().makedirs(str(path))
    else:
        os.makedirs(path, exist_ok=True)


def size(path):
    """A file's size in bytes."""
    return _gfile().stat(str(path)).length if is_remote(path) else os.path.getsize(path)


def mtime_ns(path):
    """A file's modification time in nanoseconds."""
    return _gfile().stat(str(path)).mtime_nsec if is_remote(path) else os.stat(path).st_mtime_ns


def remove(path, missing_ok=True):
    try:
        if is_remote(path):
            _gfile().remove(str(path))
        else:
            os.remove(path)
    except FileNotFoundError:
        if not missing_ok:
            raise
    except Exception as e:  # pylint: disable=broad-except  (gfile's NotFoundError)
        if not (missing_ok and type(e).__name__ == "NotFoundError"):
            raise


def rmtree(path):
    """Removes a folder and everything in it; a missing folder is fine."""
    if is_remote(path):
        if _gfile().exists(str(path)):
            _gfile().rmtree(str(path))
    else:
        shutil.rmtree(path, ignore_errors=True)


def rename(src, dst, overwrite=True):
    """Renames a file or folder (on object stores a copy and a delete)."""
    if is_remote(src) or is_remote(dst):
        _gfile().rename(str(src), str(dst), overwrite=overwrite)
    elif overwrite:
        os.replace(src, dst)
    else:
        os.rename(src, dst)


def open_file(path, mode="r", encoding=None):
    """A file object for a local or remote file (text modes use UTF-8)."""
    if is_remote(path):
        return _gfile().GFile(str(path), mode)
    if "b" not in mode:
        encoding = encoding or "utf-8"
    return open(path, mode, encoding=encoding)  # pylint: disable=consider-using-with


def read_text(path):
    with open_file(path, "r") as f:
        return f.read()


def read_bytes(path):
    with open_file(path, "rb") as f:
        return f.read()


def temporary_name(path):
    """A unique name beside ``path`` that readers never take for it."""
    folder, name = parent(path), basename(path)
    return join(folder, f".{name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")


@contextlib.contextmanager
def atomic_file(path, mode="w"):
    """Yields a file to write; on success it is renamed to ``path``, on any
    error it is removed and ``path`` is left as it was.

    A new local file gets the permissions the umask allows, like ``open``.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file writes whole files: mode 'w' or 'wb', not {mode!r}")
    tmp = temporary_name(path)
    try:
        with open_file(tmp, mode) as f:
            yield f
            if not is_remote(tmp):
                f.flush()
                os.fsync(f.fileno())
        rename(tmp, path, overwrite=True)
    except BaseException:
        remove(tmp)
        raise


def atomic_write(path, data):
    """Writes ``data`` (str or bytes) to ``path`` atomically."""
    with atomic_file(path, "wb" if isinstance(data, (bytes, bytearray)) else "w") as f:
        f.write(data)


def copy_file(src, dst):
    """Copies one file, atomically at the destination."""
    if is_remote(src) or is_remote(dst):
        tmp = temporary_name(dst)
        try:
            _gfile().copy(str(src), tmp, overwrite=True)
            rename(tmp, dst, overwrite=True)
        except BaseException:
            remove(tmp)
            raise
        return
    with open(src, "rb") as f_in, atomic_file(dst, "wb") as f_out:
        shutil.copyfileobj(f_in, f_out, 1 << 20)


def walk(top):
    """(folder, subfolders, files) for every folder under ``top``."""
    if is_remote(top):
        yield from _gfile().walk(str(top))
    else:
        yield from os.walk(top)


def copy_tree(src, dst):
    """Copies the tree ``src`` to ``dst`` (either may be remote), file by
    file, each atomically; returns the files written."""
    written = []
    for root, _, files in walk(src):
        rel = os.path.relpath(root, src) if not is_remote(src) else root[len(str(src)):]
        rel = rel.strip("/").replace(os.sep, "/")
        target = join(dst, rel) if rel not in ("", ".") else str(dst)
        makedirs(target)
        for name in sorted(files):
            copy_file(join(root, name), join(target, name))
            written.append(join(target, name))
    return written


def new_dir(parent_dir, prefix):
    """Creates and returns a fresh folder ``parent_dir/<prefix><pid>-<random>``.

    Made with the umask's permissions (``tempfile.mkdtemp`` would make it
    owner-only), so a tree built in it and swapped into place is readable by
    whom the umask allows.
    """
    path = join(parent_dir, f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    if is_remote(path):
        makedirs(path)
    else:
        os.mkdir(path, 0o777)
    return path


def swap_in(new, dest):
    """Replaces the folder ``dest`` with the folder ``new``.

    The old ``dest`` is renamed aside first and deleted last, so a complete
    version exists at every moment; :func:`recover_swap` undoes a crash
    between the two renames.
    """
    old = None
    if exists(dest):
        old = f"{str(dest).rstrip('/')}{OLD_MARK}{os.getpid()}"
        rename(dest, old, overwrite=True)
    rename(new, dest, overwrite=False)
    if old is not None:
        rmtree(old)


def recover_swap(dest):
    """Puts back the previous ``dest`` after a crash between the renames of
    :func:`swap_in`. Returns True when it did."""
    dest = str(dest).rstrip("/")
    if exists(dest):
        return False
    folder, name = parent(dest), basename(dest)
    if not isdir(folder):
        return False
    olds = [n for n in listdir(folder) if n.startswith(name + OLD_MARK)]
    if not olds:
        return False
    rename(join(folder, olds[-1]), dest, overwrite=False)
    return True


def stale_entries(folder, pattern, alive):
    """Names in ``folder`` matching ``pattern`` (fnmatch) whose writer process
    is gone: the pid follows the pattern's literal prefix, as in the names
    :func:`new_dir` and :func:`temporary_name` make. ``alive(pid)`` says
    whether a process runs."""
    prefix = pattern.split("*", 1)[0]
    found = []
    for name in listdir(folder) if isdir(folder) else []:
        if not fnmatch.fnmatch(name, pattern):
            continue
        pid = name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or not alive(int(pid)):
            found.append(name)
    return found
