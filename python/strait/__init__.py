# Strait for Python: a ctypes wrapper of the C API (include/strait/strait.h, host backend) that
# all-reduces CPU tensors and numpy arrays across regions through the caller's straitd, and
# (strait.torch) a DDP communication hook that keeps the region's own process group inside the
# region and sends only each rank's shard across regions through Strait. Built against no torch
# version: torch and numpy are imported only when a tensor or array of theirs is passed.
#
#   import strait
#   with strait.Comm(region="us-east", gateway="/run/strait/straitd.sock", job_id="job-42",
#                    compression="int8") as comm:
#       comm.allreduce(grad)           # in place; every rank of every region calls it alike
#
# Every failure raises strait.StraitError, whose .code is the C result code (strait.ERROR_*) and
# whose message is strait_last_error()'s text (or, for a bad argument caught in Python, what is
# wrong with it). A comm whose all-reduce failed stays failed (ERROR_COMM_FAILED): close it.
import ctypes
import threading

from . import _lib
from ._lib import (ERROR_ABORTED, ERROR_COMM_FAILED, ERROR_DATA_LOSS, ERROR_INTERNAL,  # noqa: F401
                   ERROR_INVALID_ARGUMENT, ERROR_MISMATCH, ERROR_PERMISSION_DENIED,
                   ERROR_RESOURCE_EXHAUSTED, ERROR_TIMEOUT, ERROR_UNAVAILABLE, ERROR_UNSUPPORTED,
                   SUCCESS, LibraryNotFound, StraitError)

__all__ = ["Comm", "StraitError", "LibraryNotFound", "version", "library_path", "SUCCESS",
           "ERROR_INVALID_ARGUMENT", "ERROR_UNSUPPORTED", "ERROR_UNAVAILABLE", "ERROR_TIMEOUT",
           "ERROR_ABORTED", "ERROR_MISMATCH", "ERROR_PERMISSION_DENIED", "ERROR_DATA_LOSS",
           "ERROR_RESOURCE_EXHAUSTED", "ERROR_COMM_FAILED", "ERROR_INTERNAL"]


def _check(result, what):
    if result != SUCCESS:
        text = _lib.load().strait_last_error().decode("utf-8", "replace")
        if not text:
            text = what
        elif not text.startswith(what):
            text = f"{what}: {text}"
        raise StraitError(result, text)


def version():
    """The loaded library's version as (major, minor, patch)."""
    lib = _lib.load()
    v = [ctypes.c_int(), ctypes.c_int(), ctypes.c_int()]
    _check(lib.strait_version(*[ctypes.byref(x) for x in v]), "strait_version")
    return tuple(x.value for x in v)


def library_path():
    """Where libstrait.so was loaded from (loading it if needed)."""
    _lib.load()
    return _lib.loaded_path()


def _encode(value, name):
    if value is None:
        return None
    if not isinstance(value, str):
        raise StraitError(ERROR_INVALID_ARGUMENT, f"{name} must be a str or None, not "
                          f"{type(value).__name__}")
    if "\0" in value:
        # C strings end at the first NUL: "a\0b" would silently become "a".
        raise StraitError(ERROR_INVALID_ARGUMENT, f"{name} contains a NUL character at index "
                          f"{value.index(chr(0))}; pass the string without it")
    return value.encode("utf-8")


def _buffer_of(x):
    """(address, element count, strait dtype value, keep-alive) of a contiguous CPU tensor or
    numpy array; StraitError(ERROR_INVALID_ARGUMENT) saying what is wrong otherwise."""
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        import torch
        if not isinstance(x, torch.Tensor):
            raise StraitError(ERROR_INVALID_ARGUMENT, f"cannot all-reduce a {type(x).__name__}")
        if x.device.type != "cpu":
            raise StraitError(ERROR_INVALID_ARGUMENT,
                              f"tensor is on {x.device}; the host backend takes CPU tensors "
                              "(copy it with .cpu() and back, or use strait.torch's hook, which "
                              "does that for its shard)")
        if x.is_sparse or x.layout != torch.strided:
            raise StraitError(ERROR_INVALID_ARGUMENT, f"tensor layout {x.layout} is not strided")
        if not x.is_contiguous():
            raise StraitError(ERROR_INVALID_ARGUMENT,
                              "tensor is not contiguous (all-reduce works in place on contiguous "
                              "memory: pass x.contiguous() and copy the result back)")
        if x.requires_grad and x.is_leaf:
            raise StraitError(ERROR_INVALID_ARGUMENT,
                              "tensor requires grad (a leaf written in place): pass x.data or a "
                              "gradient")
        name = str(x.dtype).replace("torch.", "")
        name = {"float8_e4m3fn": "float8_e4m3", "float8_e5m2": "float8_e5m2",
                "half": "float16", "float": "float32", "double": "float64"}.get(name, name)
        if name not in _lib.DTYPES:
            raise StraitError(ERROR_INVALID_ARGUMENT,
                              f"dtype {x.dtype} is not supported; Strait takes "
                              f"{', '.join(sorted(_lib.DTYPES))}")
        return x.data_ptr(), x.numel(), _lib.DTYPES[name], x
    if mod == "numpy":
        import numpy as np
        if not isinstance(x, np.ndarray):
            raise StraitError(ERROR_INVALID_ARGUMENT, f"cannot all-reduce a {type(x).__name__}")
        if not x.flags.c_contiguous:
            raise StraitError(ERROR_INVALID_ARGUMENT,
                              "array is not C-contiguous (pass np.ascontiguousarray(a) and copy "
                              "the result back)")
        if not x.flags.writeable:
            raise StraitError(ERROR_INVALID_ARGUMENT, "array is read-only (all-reduce is in place)")
        name = x.dtype.name
        if name not in _lib.DTYPES or x.dtype.byteorder == ">":
            raise StraitError(ERROR_INVALID_ARGUMENT,
                              f"dtype {x.dtype} is not supported; Strait takes "
                              f"{', '.join(sorted(_lib.DTYPES))} (native byte order)")
        return x.ctypes.data, x.size, _lib.DTYPES[name], x
    raise StraitError(ERROR_INVALID_ARGUMENT,
                      f"cannot all-reduce a {type(x).__name__}: pass a torch.Tensor or a "
                      "numpy.ndarray")


class Comm:
    """A host-backend communicator: one per process and rank, every rank of every region alike.

    region, gateway, job_id, compression: None means the library reads $STRAIT_REGION,
    $STRAIT_GATEWAY, $STRAIT_JOB_ID, $STRAIT_COMPRESSION. rank/nranks: this rank in its region
    (the same nranks in every region); root_address: "host:port" where rank 0 of the region
    listens while the comm is created (unused when nranks is 1). timeout: seconds, the deadline
    of creation and of each all-reduce. shard: the shard this rank all-reduces at its straitd
    (one straitd may serve several); None: rank when nranks > 1, else $STRAIT_SHARD, else the
    straitd's only one. Creating blocks until the region's ranks joined and the
    gateway registered the job. Methods are thread-safe (calls are serialised, in the order every
    rank must agree on)."""

    def __init__(self, region=None, rank=0, nranks=1, gateway=None, job_id=None,
                 compression=None, root_address=None, timeout=60.0, shard=None):
        lib = _lib.load()
        self._lib = lib
        self._mu = threading.Lock()
        self._handle = None
        cfg = _lib.HostConfig()
        _check(lib.strait_host_config_init(ctypes.byref(cfg)), "strait_host_config_init")
        # Keep the encoded strings alive for the call (ctypes points into them).
        self._strings = [_encode(region, "region"), _encode(root_address, "root_address"),
                         _encode(gateway, "gateway"), _encode(job_id, "job_id"),
                         _encode(compression, "compression")]
        cfg.region, cfg.root_address, cfg.gateway, cfg.job_id, cfg.compression = self._strings
        for name, v in (("rank", rank), ("nranks", nranks)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise StraitError(ERROR_INVALID_ARGUMENT, f"{name} must be an int")
        cfg.rank, cfg.nranks = rank, nranks
        if shard is not None:
            if not isinstance(shard, int) or isinstance(shard, bool) or not 0 <= shard <= 4095:
                raise StraitError(ERROR_INVALID_ARGUMENT,
                                  f"shard must be an int in 0..4095 or None, not {shard!r}")
            cfg.shard = shard
        if not (0 < timeout <= 2**31 / 1000):
            raise StraitError(ERROR_INVALID_ARGUMENT, f"timeout must be in (0, 2147483] s, "
                              f"not {timeout}")
        cfg.timeout_ms = max(1, int(timeout * 1000))
        handle = ctypes.c_void_p()
        _check(lib.strait_comm_init_host(ctypes.byref(handle), ctypes.byref(cfg)),
               "strait_comm_init_host")
        self._handle = handle
        self.region, self.rank, self.nranks = region, rank, nranks
        self.timeout = timeout

    def allreduce(self, x, op="sum", key=None):
        """All-reduces x in place across every rank of every region and returns x. x: a
        contiguous CPU torch.Tensor or numpy.ndarray of a dtype the C API takes. op: "sum",
        "prod", "max", "min" or "avg". key: the tensor's name at the gateway (1-200 bytes;
        error-feedback residuals are kept per key); None derives it from dtype and size.
        Blocks (without holding the GIL) until the result is in x or the deadline passed."""
        if op not in _lib.OPS:
            raise StraitError(ERROR_INVALID_ARGUMENT,
                              f"op must be one of {', '.join(_lib.OPS)}, not {op!r}")
        addr, count, dtype, keep = _buffer_of(x)
        k = _encode(key, "key")
        with self._mu:
            if self._handle is None:
                raise StraitError(ERROR_INVALID_ARGUMENT, "the comm is closed")
            if count == 0:
                return x
            if k is None:
                r = self._lib.strait_allreduce(addr, addr, count, dtype, _lib.OPS[op],
                                               self._handle, None)
            else:
                r = self._lib.strait_allreduce_keyed(addr, addr, count, dtype, _lib.OPS[op], k,
                                                     self._handle, None)
            _check(r, "strait_allreduce")
        del keep
        return x

    @property
    def closed(self):
        return self._handle is None

    def close(self):
        """Destroys the comm (idempotent). Blocks briefly while outstanding sends finish."""
        with self._mu:
            if self._handle is None:
                return
            handle, self._handle = self._handle, None
            _check(self._lib.strait_comm_destroy(handle), "strait_comm_destroy")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown: nothing to report to
            pass

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return f"<strait.Comm region={self.region!r} rank={self.rank}/{self.nranks} {state}>"
