#!/usr/bin/python3
"""A pass-through file system (FUSE, Debian's python3-fusepy) whose fsync and fdatasync fail with
EIO while a flag file exists: a session store's failed sync on the kernel's real path
(fdatasync -> FUSE -> this process -> EIO), for the integration tests. Everything else goes to
the backing directory as it is.

Usage: failing-fs.py BACKING MOUNTPOINT FLAG   (in the foreground; unmounted when it ends)
Run it in a private mount namespace (the integration harness's): never on the machine's own.
"""
import errno
import os
import sys

from fusepy import FUSE, FuseOSError, Operations


class FailingSync(Operations):
    def __init__(self, root, flag):
        self.root = os.path.realpath(root)
        self.flag = flag

    def _path(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def _call(self, function, *args):
        try:
            return function(*args)
        except OSError as error:
            raise FuseOSError(error.errno)

    # Metadata
    def access(self, path, mode):
        if not os.access(self._path(path), mode):
            raise FuseOSError(errno.EACCES)

    def getattr(self, path, fh=None):
        st = self._call(os.lstat, self._path(path))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime", "st_mtime", "st_ctime")
        return {key: getattr(st, key) for key in keys}

    def chmod(self, path, mode):
        return self._call(os.chmod, self._path(path), mode)

    def chown(self, path, uid, gid):
        return self._call(os.chown, self._path(path), uid, gid)

    def utimens(self, path, times=None):
        return self._call(os.utime, self._path(path), times)

    def statfs(self, path):
        st = self._call(os.statvfs, self._path(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")
        return {key: getattr(st, key) for key in keys}

    # Directories
    def readdir(self, path, fh):
        return [".", ".."] + self._call(os.listdir, self._path(path))

    def mkdir(self, path, mode):
        return self._call(os.mkdir, self._path(path), mode)

    def rmdir(self, path):
        return self._call(os.rmdir, self._path(path))

    def unlink(self, path):
        return self._call(os.unlink, self._path(path))

    def rename(self, old, new):
        return self._call(os.rename, self._path(old), self._path(new))

    def opendir(self, path):
        return 0

    def fsyncdir(self, path, datasync, fh):
        if os.path.exists(self.flag):
            raise FuseOSError(errno.EIO)
        fd = self._call(os.open, self._path(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._call(os.fsync, fd)
        finally:
            os.close(fd)
        return 0

    # Files
    def open(self, path, flags):
        return self._call(os.open, self._path(path), flags)

    def create(self, path, mode, fi=None):
        return self._call(os.open, self._path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path, length, offset, fh):
        return self._call(os.pread, fh, length, offset)

    def write(self, path, data, offset, fh):
        return self._call(os.pwrite, fh, data, offset)

    def truncate(self, path, length, fh=None):
        if fh is not None:
            return self._call(os.ftruncate, fh, length)
        return self._call(os.truncate, self._path(path), length)

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        return self._call(os.close, fh)

    def fsync(self, path, datasync, fh):
        if os.path.exists(self.flag):
            raise FuseOSError(errno.EIO)
        return self._call(os.fdatasync if datasync else os.fsync, fh)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    backing, mountpoint, flag = sys.argv[1:]
    FUSE(FailingSync(backing, flag), mountpoint, foreground=True, nothreads=True, allow_other=True)


if __name__ == "__main__":
    main()
