"""The device rules of a cgroup v2 job: an eBPF program of type BPF_PROG_TYPE_CGROUP_DEVICE,
assembled here and loaded and attached with the bpf(2) syscall through ctypes (cgroup v2 has no
devices.deny file; systemd does the same for DeviceAllow=).

The program denies the listed character devices (the node's other GPUs) and allows every other
device, as the v1 backend's devices.deny lines do. It is attached with BPF_F_ALLOW_MULTI, so the
programs of the cgroups above still run too (a device must pass all of them), and a step's
cgroup may add its own. It stays attached until the cgroup is removed.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

#: bpf(2)'s number on the architectures gq runs on.
_NR_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361}
_BPF_PROG_LOAD = 5
_BPF_PROG_ATTACH = 8
_BPF_PROG_TYPE_CGROUP_DEVICE = 15
_BPF_CGROUP_DEVICE = 6
_BPF_F_ALLOW_MULTI = 2
#: bpf_cgroup_dev_ctx: access_type (access << 16 | type), major, minor; type 2 is a char device.
_DEV_CHAR = 2
_ATTR_SIZE = 128

# Opcodes (linux/bpf_common.h, linux/bpf.h).
_LDX_W = 0x61    # dst = *(u32 *)(src + off)
_AND64_K = 0x57  # dst &= imm
_JNE_K = 0x55    # if dst != imm: pc += off
_JEQ_K = 0x15    # if dst == imm: pc += off
_MOV64_K = 0xB7  # dst = imm
_EXIT = 0x95


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def program(deny: tuple[tuple[int, int], ...]) -> bytes:
    """The instructions: r0 = 0 (deny) for a char device in `deny`, else r0 = 1 (allow)."""
    body = [_insn(_LDX_W, 2, 1, 0), _insn(_AND64_K, 2, imm=0xFFFF),  # r2 = type
            _insn(_LDX_W, 3, 1, 4), _insn(_LDX_W, 4, 1, 8)]          # r3 = major, r4 = minor
    # Each rule: if type, major and minor all match, jump to the deny exit. The jumps count
    # instructions from the next one; `rest` is how many rules follow this one.
    for i, (major, minor) in enumerate(deny):
        rest = len(deny) - i - 1
        to_deny = 3 * rest + 2  # past the later rules and the allow exit
        body += [_insn(_JNE_K, 2, off=2, imm=_DEV_CHAR), _insn(_JNE_K, 3, off=1, imm=major),
                 _insn(_JEQ_K, 4, off=to_deny, imm=minor)]
    body += [_insn(_MOV64_K, 0, imm=1), _insn(_EXIT), _insn(_MOV64_K, 0, imm=0), _insn(_EXIT)]
    return b"".join(body)


def attach(cgroup_dir: str, deny: tuple[tuple[int, int], ...]) -> None:
    """Load the program for `deny` and attach it to the cgroup at `cgroup_dir` (OSError)."""
    code = program(deny)
    prog_fd = _load(code)
    try:
        dir_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _bpf(_BPF_PROG_ATTACH, struct.pack("<IIII", dir_fd, prog_fd, _BPF_CGROUP_DEVICE,
                                               _BPF_F_ALLOW_MULTI))
        finally:
            os.close(dir_fd)
    finally:
        os.close(prog_fd)  # the attachment holds the program now


def _load(code: bytes) -> int:
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    attr = struct.pack("<IIQQIIQII16s", _BPF_PROG_TYPE_CGROUP_DEVICE, len(code) // 8,
                       ctypes.addressof(insns), ctypes.addressof(license_), 1, len(log),
                       ctypes.addressof(log), 0, 0, b"gq_devices")
    try:
        return _bpf(_BPF_PROG_LOAD, attr)
    except OSError as exc:
        detail = log.value.decode(errors="replace").strip()
        raise OSError(exc.errno, f"cannot load the device program: {exc.strerror}"
                      + (f" ({detail})" if detail else "")) from None


def _bpf(cmd: int, attr: bytes) -> int:
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(38, f"bpf(2): no syscall number known for {platform.machine()}")
    buf = ctypes.create_string_buffer(attr, _ATTR_SIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), buf, ctypes.c_uint(_ATTR_SIZE))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(result)
