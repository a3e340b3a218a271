"""Reading ``.npz`` archives without trusting them: headers first, then only the rows needed.

An ``.npz`` file is a zip archive of ``.npy`` members, each a small header (shape, dtype,
memory order) followed by the raw bytes. ``numpy.load`` would allocate whatever a header
declares before reading a byte of data, so a few hundred bytes can ask for terabytes, and it
reads a whole array even when one image of it is wanted. :class:`NpzArchive` instead

* reads every member's header first (:meth:`NpzArchive.headers`) and refuses a header that
  declares more data than the member can hold -- more than its stored size, or, for a
  compressed member, more than deflate can expand it to (at most about 1032-fold; the bound
  used is :data:`DEFLATE_MAX_RATIO`) -- and any array of Python objects (what
  ``allow_pickle=False`` refuses: such arrays are never unpickled);
* checks an allocation against the memory available (:func:`require_memory`) before making it;
* reads only the rows asked for (:meth:`NpzArchive.rows`), streaming through the member, or a
  whole array in bounded blocks (:meth:`NpzArchive.blocks`).

Used for the library's ``.npz`` datasets (:mod:`leakagelib.data.npz_format`) and for the
MedMNIST release files (:mod:`leakagelib.data.external`).
"""

from __future__ import annotations

import math
import os
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

import numpy as np

#: Largest ratio of declared to compressed size accepted for a deflated member. Deflate cannot
#: expand data more than about 1032-fold (zlib's technical notes), so a header declaring more
#: is corrupt or crafted; the margin above 1032 covers the small members' fixed overheads.
DEFLATE_MAX_RATIO = 1100

#: Bytes read per step when streaming a member (bounds the temporary copies).
CHUNK_BYTES = 1 << 22

_READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error)


@dataclass(frozen=True)
class ArrayHeader:
    """What an ``.npy`` member's header declares; ``offset`` is where its data starts."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    offset: int

    @property
    def nbytes(self) -> int:
        """Bytes of data the header declares."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def row_bytes(self) -> int:
        """Bytes of one entry along the first axis (one image, one label)."""
        return math.prod(self.shape[1:]) * self.dtype.itemsize


def describe_bytes(count: int) -> str:
    """``count`` bytes in the largest binary unit that keeps the number at least 1."""
    value, unit = float(count), "bytes"
    for larger in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{count} bytes" if unit == "bytes" else f"{value:.1f} {unit}"


def available_memory() -> int | None:
    """Bytes of memory this machine could give the process now (Linux ``MemAvailable``)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def require_memory(path: Path, nbytes: int, what: str) -> None:
    """Raise a MemoryError that says so before allocating ``nbytes`` the machine lacks."""
    available = available_memory()
    if available is not None and nbytes > available:
        raise MemoryError(
            f"{path}: {what} need {describe_bytes(nbytes)} of memory, but only "
            f"{describe_bytes(available)} is available; pass a smaller n= to load fewer images, "
            f"or use a machine with more memory."
        )


class NpzArchive:
    """An open ``.npz`` archive whose arrays are read header-first (see the module docstring).

    Use as a context manager: ``with NpzArchive(path) as archive: ...``.
    """

    def __init__(self, path: Path) -> None:
        if not path.is_file():
            raise FileNotFoundError(f"No .npz file at {path}.")
        with open(path, "rb") as file:
            if file.read(6) == b"\x93NUMPY":
                raise ValueError(
                    f"{path} holds a single array (.npy), not an .npz archive of arrays."
                )
        try:
            self._zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as error:
            raise ValueError(f"{path} is not a readable .npz archive: {error}") from error
        self.path = path
        #: Names of the arrays in the archive (members ``NAME.npy``), sorted.
        self.files = sorted(n[:-4] for n in self._zip.namelist() if n.endswith(".npy"))

    def __enter__(self) -> NpzArchive:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._zip.close()

    def headers(
        self, required: tuple[str, ...], optional: tuple[str, ...], needs: str
    ) -> dict[str, ArrayHeader]:
        """Checked headers of the ``required`` and the present ``optional`` arrays.

        A missing required array raises a ValueError naming it, what the file holds and
        ``needs`` (what the format expects).
        """
        missing = [name for name in required if name not in self.files]
        if missing:
            raise ValueError(
                f"{self.path} lacks the array(s) {missing}; it holds {self.files}, but {needs}."
            )
        names = [*required, *(name for name in optional if name in self.files)]
        return {name: self._header(name) for name in names}

    def _header(self, name: str) -> ArrayHeader:
        """The header of array ``name``, read without its data, then checked."""
        info = self._zip.getinfo(f"{name}.npy")
        try:
            with self._zip.open(info) as member:
                version = np.lib.format.read_magic(member)
                if version not in ((1, 0), (2, 0), (3, 0)):
                    raise ValueError(f"unknown .npy format version {version}")
                read = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, fortran_order, dtype = read(member)
                offset = member.tell()
        except _READ_ERRORS as error:
            raise ValueError(
                f"{self.path}: could not read its arrays: {name!r} has no valid .npy header "
                f"({error})."
            ) from error
        if dtype.hasobject:
            raise ValueError(
                f"{self.path}: could not read array {name!r}: it holds Python objects (dtype "
                f"{dtype}), which only unpickling could read, and .npz files are read with "
                f"allow_pickle=False; save it as a numeric or string array."
            )
        header = ArrayHeader(name, tuple(int(s) for s in shape), dtype, bool(fortran_order), offset)
        self._check_declared_size(header, info)
        return header

    def _check_declared_size(self, header: ArrayHeader, info: zipfile.ZipInfo) -> None:
        """Refuse a header declaring more data than its member holds (module docstring)."""
        declared = header.offset + header.nbytes
        claim = (
            f"{self.path}: array {header.name!r} declares shape {header.shape} of {header.dtype} "
            f"({describe_bytes(header.nbytes)})"
        )
        fix = "the file is corrupt or crafted; re-create it with numpy.savez."
        if info.compress_type == zipfile.ZIP_DEFLATED and (
            declared > DEFLATE_MAX_RATIO * info.compress_size
        ):
            raise ValueError(
                f"{claim}, but its member is only {info.compress_size} bytes compressed and "
                f"deflate expands data at most about 1032-fold; {fix}"
            )
        if declared > info.file_size:
            raise ValueError(
                f"{claim}, but the archive holds only {max(info.file_size - header.offset, 0)} "
                f"bytes of its data; {fix}"
            )

    def _open(self, header: ArrayHeader) -> IO[bytes]:
        """Array ``header.name``'s member, positioned at the start of its data."""
        member = self._zip.open(f"{header.name}.npy")
        member.seek(header.offset)
        return member

    def _fill(self, member: IO[bytes], target: memoryview, name: str) -> None:
        """Read exactly ``len(target)`` bytes of array ``name`` into ``target``."""
        filled = 0
        while filled < len(target):
            step = min(CHUNK_BYTES, len(target) - filled)
            try:
                got = member.readinto(target[filled : filled + step])
            except _READ_ERRORS as error:
                raise ValueError(f"{self.path}: could not read array {name!r}: {error}") from error
            if not got:
                raise self._truncated(name)
            filled += got

    def _truncated(self, name: str) -> ValueError:
        """The error for a member whose data ends before what its header declares."""
        return ValueError(
            f"{self.path}: could not read array {name!r}: its data ends early (the file is "
            f"truncated); re-create it with numpy.savez."
        )

    def _skip(self, member: IO[bytes], position: int, name: str) -> None:
        """Read forward to ``position`` in steps of :data:`CHUNK_BYTES` (``seek`` would
        decompress up to 16 MiB at a time), discarding what is read."""
        left = position - member.tell()
        while left > 0:
            try:
                got = len(member.read(min(CHUNK_BYTES, left)))
            except _READ_ERRORS as error:
                raise ValueError(f"{self.path}: could not read array {name!r}: {error}") from error
            if not got:
                raise self._truncated(name)
            left -= got

    def read(self, header: ArrayHeader) -> np.ndarray:
        """The whole array, after checking that the memory for it is available."""
        require_memory(self.path, header.nbytes, f"array {header.name!r} (shape {header.shape})")
        array = np.empty(header.shape[::-1] if header.fortran_order else header.shape, header.dtype)
        with self._open(header) as member:
            self._fill(member, _bytes_of(array), header.name)
        return array.T if header.fortran_order else array

    def rows(self, header: ArrayHeader, indices: np.ndarray) -> np.ndarray:
        """Entries ``indices`` (distinct, along the first axis) of an array, in that order.

        Only those rows are read: the member is streamed once, in file order, skipping the
        rest. (A Fortran-ordered array has no contiguous rows and is read whole.)
        """
        if header.fortran_order:
            return np.ascontiguousarray(self.read(header)[indices])
        order = np.argsort(indices, kind="stable")
        wanted = indices[order]
        picked = np.empty((len(wanted), *header.shape[1:]), header.dtype)
        target, size = _bytes_of(picked), header.row_bytes
        breaks = np.flatnonzero(np.diff(wanted) != 1) + 1
        starts, ends = np.concatenate(([0], breaks)), np.concatenate((breaks, [len(wanted)]))
        with self._open(header) as member:
            for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
                if start < end:
                    self._skip(member, header.offset + int(wanted[start]) * size, header.name)
                    self._fill(member, target[start * size : end * size], header.name)
        result = np.empty_like(picked)
        result[order] = picked
        return result

    def blocks(self, header: ArrayHeader) -> Iterator[np.ndarray]:
        """The whole array as consecutive blocks of rows of at most about :data:`CHUNK_BYTES`."""
        if header.fortran_order:
            yield self.read(header)
            return
        per_block = max(1, CHUNK_BYTES // max(header.row_bytes, 1))
        with self._open(header) as member:
            for start in range(0, header.shape[0], per_block):
                count = min(per_block, header.shape[0] - start)
                block = np.empty((count, *header.shape[1:]), header.dtype)
                self._fill(member, _bytes_of(block), header.name)
                yield block


def _bytes_of(array: np.ndarray) -> memoryview:
    """The bytes of a freshly allocated (C-contiguous) array, as a writable view."""
    return memoryview(array.reshape(-1).view(np.uint8))


def read_arrays(
    path: Path, required: tuple[str, ...], optional: tuple[str, ...], needs: str
) -> dict[str, np.ndarray]:
    """The ``required`` (and present ``optional``) arrays of an ``.npz`` archive, read whole.

    Each header is checked first (see :class:`NpzArchive`); a missing file, a file that is not
    an archive, a missing key (``needs`` says what the format expects) or an unreadable (e.g.
    pickled object) array raises an error that names it.
    """
    with NpzArchive(path) as archive:
        headers = archive.headers(required, optional, needs)
        return {name: archive.read(header) for name, header in headers.items()}
