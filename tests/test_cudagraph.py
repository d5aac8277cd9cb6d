"""grace.cudagraph's memory readers on host memory laid out as the driver lays out node parameters."""

from __future__ import annotations

import ctypes

from grace.compat import cuda as cuda_compat
from grace.cudagraph import KernelParam, read_extra_buffer, read_kernel_params


def test_read_kernel_params_follows_the_pointer_array() -> None:
    a = ctypes.c_uint64(0x7F00_0000_1000)
    b = ctypes.c_int32(-5)
    c = (ctypes.c_char * 12)(*b"abcdefghijkl")
    array = (ctypes.c_void_p * 3)(ctypes.addressof(a), ctypes.addressof(b), ctypes.addressof(c))
    raws = read_kernel_params(ctypes.addressof(array), [8, 4, 12])
    assert raws[0] == (0x7F00_0000_1000).to_bytes(8, "little")
    assert int.from_bytes(raws[1], "little", signed=True) == -5
    assert raws[2] == b"abcdefghijkl"
    assert KernelParam(0, 0, 8, raws[0]).as_pointer() == 0x7F00_0000_1000
    assert KernelParam(1, 8, 4, raws[1]).as_pointer() is None
    assert read_kernel_params(0, [8]) == []


def test_read_extra_buffer_finds_buffer_and_size() -> None:
    payload = (ctypes.c_char * 24)(*bytes(range(24)))
    size = ctypes.c_size_t(24)
    extra = (ctypes.c_void_p * 5)(
        cuda_compat.LAUNCH_PARAM_BUFFER_POINTER,
        ctypes.addressof(payload),
        cuda_compat.LAUNCH_PARAM_BUFFER_SIZE,
        ctypes.addressof(size),
        cuda_compat.LAUNCH_PARAM_END,
    )
    assert read_extra_buffer(ctypes.addressof(extra)) == bytes(range(24))
    assert read_extra_buffer(0) is None
    no_buffer = (ctypes.c_void_p * 2)(cuda_compat.LAUNCH_PARAM_END, 0)
    assert read_extra_buffer(ctypes.addressof(no_buffer)) is None


def test_check_unwraps_and_raises_with_the_call_name() -> None:
    import pytest

    assert cuda_compat.check("f", (0, 5)) == 5
    assert cuda_compat.check("f", (0, 1, 2)) == (1, 2)
    assert cuda_compat.check("f", (0,)) is None
    with pytest.raises(cuda_compat.CudaDriverError, match="cuFoo failed"):
        cuda_compat.check("cuFoo", (700, None))
