# Finds and loads libstrait.so through ctypes and declares the C API of include/strait/strait.h
# (API level 1) on it. Internal: strait.Comm is the public face. $STRAIT_LIBRARY, when set, is
# the only library tried (a user who names one never gets another silently). Otherwise the
# library is looked for, in order, next to this package (a copy placed there by a packager), in the
# build directories of the source tree this package sits in, on the dynamic loader's path
# (libstrait.so.0, then libstrait.so: an installed library), and last in the build directories
# under the current directory (a pip-installed package run from a source tree); the error names
# every path tried. strait.cluster.find_straitd looks for straitd in the same order.
import ctypes
import ctypes.util
import os
import threading

# strait_result_t (values are explicit in strait.h and never renumbered).
SUCCESS = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_UNSUPPORTED = 2
ERROR_UNAVAILABLE = 3
ERROR_TIMEOUT = 4
ERROR_ABORTED = 5
ERROR_MISMATCH = 6
ERROR_PERMISSION_DENIED = 7
ERROR_DATA_LOSS = 8
ERROR_RESOURCE_EXHAUSTED = 9
ERROR_COMM_FAILED = 10
ERROR_INTERNAL = 11

RESULT_NAMES = {
    0: "STRAIT_SUCCESS", 1: "STRAIT_ERROR_INVALID_ARGUMENT", 2: "STRAIT_ERROR_UNSUPPORTED",
    3: "STRAIT_ERROR_UNAVAILABLE", 4: "STRAIT_ERROR_TIMEOUT", 5: "STRAIT_ERROR_ABORTED",
    6: "STRAIT_ERROR_MISMATCH", 7: "STRAIT_ERROR_PERMISSION_DENIED", 8: "STRAIT_ERROR_DATA_LOSS",
    9: "STRAIT_ERROR_RESOURCE_EXHAUSTED", 10: "STRAIT_ERROR_COMM_FAILED",
    11: "STRAIT_ERROR_INTERNAL",
}

# strait_datatype_t and strait_redop_t.
DTYPES = {
    "int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6,
    "float32": 7, "float64": 8, "bfloat16": 9, "float8_e4m3": 10, "float8_e5m2": 11,
}
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}


class HostConfig(ctypes.Structure):
    """strait_host_config_t; always filled by strait_host_config_init first."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("region", ctypes.c_char_p),
        ("rank", ctypes.c_int),
        ("nranks", ctypes.c_int),
        ("root_address", ctypes.c_char_p),
        ("gateway", ctypes.c_char_p),
        ("job_id", ctypes.c_char_p),
        ("compression", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int),
        ("shard", ctypes.c_int),
    ]


class StraitError(RuntimeError):
    """A failed Strait call. `code` is the strait_result_t value, `code_name` its name (e.g.
    "STRAIT_ERROR_TIMEOUT"), `message` what the library (or the argument check) said."""

    def __init__(self, code, message):
        self.code = int(code)
        self.code_name = RESULT_NAMES.get(self.code, "unknown")
        self.message = message
        super().__init__(f"{self.code_name}: {message}")


class LibraryNotFound(StraitError, OSError):
    """No libstrait.so could be loaded (code ERROR_UNAVAILABLE); the message lists every path
    tried and why it failed."""

    def __init__(self, message):
        StraitError.__init__(self, ERROR_UNAVAILABLE, message)


# CMake presets (CMakePresets.json) whose build directories are searched, in this order.
BUILD_PRESETS = ("release", "ci", "dev", "asan")


def _build_tree(base, where):
    return [(where, os.path.abspath(os.path.join(base, "build", preset, "lib", "api",
                                                 "libstrait.so")))
            for preset in BUILD_PRESETS]


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    env = os.environ.get("STRAIT_LIBRARY")
    if env:
        return [("$STRAIT_LIBRARY", env)]
    out = []
    for name in ("libstrait.so.0", "libstrait.so"):
        out.append(("next to the package", os.path.join(here, name)))
    out += _build_tree(os.path.join(here, "..", ".."), "the package's source tree")
    for name in ("libstrait.so.0", "libstrait.so"):
        out.append(("the loader's path", name))
    found = ctypes.util.find_library("strait")
    if found:
        out.append(("ldconfig", found))
    cwd = _build_tree(os.getcwd(), "the current directory")
    out += [c for c in cwd if all(c[1] != o[1] for o in out)]
    return out


def _declare(lib):
    c_int_p = ctypes.POINTER(ctypes.c_int)
    comm = ctypes.c_void_p
    sigs = {
        "strait_host_config_init": (ctypes.c_int, [ctypes.POINTER(HostConfig)]),
        "strait_comm_init_host": (ctypes.c_int, [ctypes.POINTER(comm), ctypes.POINTER(HostConfig)]),
        "strait_allreduce_keyed": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                                  ctypes.c_int, ctypes.c_int, ctypes.c_char_p, comm,
                                                  ctypes.c_void_p]),
        "strait_allreduce": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                            ctypes.c_int, ctypes.c_int, comm, ctypes.c_void_p]),
        "strait_comm_rank": (ctypes.c_int, [comm, c_int_p, c_int_p]),
        "strait_comm_destroy": (ctypes.c_int, [comm]),
        "strait_version": (ctypes.c_int, [c_int_p, c_int_p, c_int_p]),
        "strait_last_error": (ctypes.c_char_p, []),
        "strait_result_string": (ctypes.c_char_p, [ctypes.c_int]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)  # AttributeError: not a libstrait.so of API level 1
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


_lock = threading.Lock()
_lib = None
_path = None


def load():
    """Returns the loaded library (loaded once per process); raises LibraryNotFound."""
    global _lib, _path
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for where, path in _candidates():
            if os.sep in path and not os.path.exists(path):
                tried.append(f"{path} ({where}: no such file)")
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append(f"{path} ({where}: {e})")
                continue
            try:
                _lib = _declare(lib)
            except AttributeError as e:
                tried.append(f"{path} ({where}: not Strait's C API: {e})")
                continue
            _path = path
            return _lib
        if os.environ.get("STRAIT_LIBRARY"):
            raise LibraryNotFound(
                "strait: cannot load the library $STRAIT_LIBRARY names: " + tried[0] +
                ". Point STRAIT_LIBRARY at a built libstrait.so (build/<preset>/lib/api), or "
                "unset it to search next to the package, the build tree and the loader's path.")
        raise LibraryNotFound(
            "strait: cannot load libstrait.so; tried " + "; ".join(tried) +
            ". Build it (cmake --build build/release --target strait_api) and set STRAIT_LIBRARY "
            "to its path, or install the strait .deb.")


def loaded_path():
    """The path (or loader name) the library was loaded from; None before load()."""
    return _path
