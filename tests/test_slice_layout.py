"""The C header and the Python mirror agree on every byte of the slice file.

A small C program, compiled here against ``native/include/hami/slice_file.h``
with the system compiler, prints (one JSON object per line) the size and
alignment of every struct, the offset, size, element count and type check of
every field, and the value of every ``#define``. The tests compare each figure
with the ctypes classes of :mod:`hami_jupyter.slice.layout`.

Two witnesses keep a field from being added on one side only:

* the C program is generated from ``C_FIELDS`` below, a list written by hand
  from the header; it must name the same fields, in the same order, as the
  ctypes classes, and those fields must cover every byte of each C struct
  (the header has no implicit padding: spare room is an explicit ``reserved``
  field), so a C field missing from the list leaves a hole and fails;
* the expected C type of each field is derived from its ctypes type and
  checked by the compiler (``__builtin_types_compatible_p``), which also pins
  every array length.
"""

import ctypes
import json
import re
import subprocess
from pathlib import Path

import pytest

from hami_jupyter.slice import layout

REPO = Path(__file__).resolve().parent.parent
INCLUDE = REPO / "native" / "include"
HEADER = INCLUDE / "hami" / "slice_file.h"
DOC = REPO / "docs" / "slice-file.md"

# Second witness: the fields of each struct in slice_file.h, in order, copied
# by hand. Arrays end in "[]".
C_FIELDS = {
    "hami_slice_header": [
        "magic[]", "version_major", "version_minor", "file_size", "header_size",
        "flags", "max_devices", "max_slots", "device_size", "slot_size",
        "limits_offset", "devices_offset", "slots_offset", "created_unix_ns",
        "name[]", "reserved[]",
    ],
    "hami_device_limit": [
        "memory_limit", "sm_share", "mode", "max_decoders", "flags", "memory_guarantee",
    ],
    "hami_limit_set": ["device[]", "fallback"],
    "hami_slice_limits": ["generation", "changed_unix_ns", "copy[]"],
    "hami_slice_device": [
        "state", "sm_count", "uuid[]", "memory_total", "memory_used", "memory_peak",
        "sm_util", "decoders", "sm_sample_us", "sm_open_ppm", "sm_tuned_for",
        "sm_others_util", "sm_waits", "sm_waits_steered", "reserved0",
        "sm_restart_ns",
    ],
    "hami_slot": [
        "state", "pid", "pid_ns", "uid", "txn", "started_unix_ns",
        "active_unix_ns", "kernel_id[]", "comm[]", "memory_used[]", "sm_util[]",
        "decoders[]", "frames_decoded", "frames_mapped", "decode_ns", "park_state", "park_wanted",
        "park_wait", "park_error", "park_unix_ns", "gpu_active_unix_ns", "parked[]", "driver_bytes[]",
        "changes", "park_reason", "room_wait_device", "room_wait_since_unix_ns",
        "room_wait_bytes", "park_fast", "park_fast_able", "reserved[]",
    ],
    "hami_slice_file": ["header", "limits", "device[]", "slot[]"],
    "hami_limits_file": ["magic[]", "version_major", "version_minor", "file_size", "reserved[]", "limits"],
    "hami_room_grant": ["ticket", "bytes", "expires_unix_ns", "pid", "reserved"],
    "hami_ledger_gpu": [
        "seq", "uuid[]", "reserve_bytes", "granted_bytes", "free_bytes", "looked_unix_ns",
        "moving_until_unix_ns", "turns", "waiting", "reserved[]", "grant[]",
    ],
    "hami_room_ledger": [
        "magic[]", "version_major", "version_minor", "file_size", "written_unix_ns", "agent_pid",
        "reserved0", "reserved[]", "gpu[]",
    ],
}

PY_STRUCTS = {cls._c_name_: cls for cls in layout.STRUCTS}

_SCALAR_C_TYPES = {
    ctypes.c_char: "char",
    ctypes.c_uint8: "uint8_t",
    ctypes.c_int32: "int32_t",
    ctypes.c_uint32: "uint32_t",
    ctypes.c_uint64: "uint64_t",
}


def c_type_name(ctype):
    """The C type name a ctypes type stands for: ``uint64_t[16]``, ``struct hami_slot``."""
    dims = ""
    while issubclass(ctype, ctypes.Array):
        dims += f"[{ctype._length_}]"
        ctype = ctype._type_
    if issubclass(ctype, ctypes.Structure):
        return f"struct {ctype._c_name_}{dims}"
    return _SCALAR_C_TYPES[ctype] + dims


def header_defines():
    """``{name: value text}`` of every valued ``#define HAMI_*`` in the header."""
    text = HEADER.read_text()
    return dict(re.findall(r"^\s*#\s*define\s+(HAMI_\w+)[ \t]+(\S+)", text, re.M))


def python_constants():
    return {
        name: value
        for name, value in vars(layout).items()
        if re.fullmatch(r"HAMI_[A-Z0-9_]+", name) and isinstance(value, (int, bytes, str))
    }


def _py_field_types(struct):
    cls = PY_STRUCTS.get(struct)
    return dict(cls._fields_) if cls else {}


def c_program():
    """Source of the C program that reports the layout as JSON lines."""
    out = [
        "#include <stddef.h>",
        "#include <stdint.h>",
        "#include <stdio.h>",
        '#include "hami/slice_file.h"',
        "#define M(S, f) (((struct S *)0)->f)",
        "int main(void) {",
    ]
    for struct, fields in C_FIELDS.items():
        out.append(
            f'  printf("{{\\"struct\\": \\"{struct}\\", \\"size\\": %zu, \\"align\\": %zu}}\\n", '
            f"sizeof(struct {struct}), _Alignof(struct {struct}));"
        )
        py_types = _py_field_types(struct)
        for entry in fields:
            name = entry.rstrip("[]")
            member = f"M({struct}, {name})"
            count = f"sizeof {member} / sizeof {member}[0]" if entry.endswith("[]") else "(size_t)0"
            # -1: ctypes has no such field, so there is no type to check.
            type_ok = (
                f"__builtin_types_compatible_p(__typeof__({member}), {c_type_name(py_types[name])})"
                if name in py_types else "-1"
            )
            out.append(
                f'  printf("{{\\"struct\\": \\"{struct}\\", \\"field\\": \\"{name}\\", '
                f'\\"offset\\": %zu, \\"size\\": %zu, \\"count\\": %zu, \\"type_ok\\": %d}}\\n", '
                f"offsetof(struct {struct}, {name}), sizeof {member}, {count}, (int)({type_ok}));"
            )
    for name, value in header_defines().items():
        if value.startswith('"'):
            fmt, arg = '\\"%s\\"', name
        else:
            fmt, arg = "%llu", f"(unsigned long long)({name})"
        out.append(f'  printf("{{\\"define\\": \\"{name}\\", \\"value\\": {fmt}}}\\n", {arg});')
    out += ["  return 0;", "}"]
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    """What the compiled program says: structs, fields and defines."""
    work = tmp_path_factory.mktemp("layout")
    src, exe = work / "layout.c", work / "layout"
    src.write_text(c_program())
    compile_cmd = ["cc", "-std=gnu11", "-Wall", f"-I{INCLUDE}", "-o", str(exe), str(src)]
    built = subprocess.run(compile_cmd, capture_output=True, text=True)
    if built.returncode != 0:
        missing = sorted(set(re.findall(r"(struct \w+). has no member named .(\w+)", built.stderr)))
        summary = "".join(f"\n  {s} has no field {f} (C_FIELDS and ctypes name it)" for s, f in missing)
        pytest.fail(
            f"compiling the layout probe failed ({' '.join(compile_cmd)}){summary}\n{built.stderr}",
            pytrace=False,
        )
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    structs, fields, defines = {}, {}, {}
    for record in map(json.loads, lines.splitlines()):
        if "define" in record:
            defines[record["define"]] = record["value"]
        elif "field" in record:
            fields.setdefault(record["struct"], {})[record["field"]] = record
        else:
            structs[record["struct"]] = record
    return {"structs": structs, "fields": fields, "defines": defines}


def _fail_on(problems):
    if problems:
        pytest.fail("slice_file.h and hami_jupyter/slice/layout.py disagree:\n  " + "\n  ".join(problems), pytrace=False)


def test_same_structs():
    assert set(PY_STRUCTS) == set(C_FIELDS), (
        f"ctypes classes {sorted(PY_STRUCTS)} vs hand list of C structs {sorted(C_FIELDS)}"
    )


def test_same_fields_in_same_order():
    problems = []
    for struct, c_entries in C_FIELDS.items():
        c_names = [e.rstrip("[]") for e in c_entries]
        py_names = list(_py_field_types(struct))
        if len(c_names) != len(py_names):
            problems.append(f"struct {struct}: C has {len(c_names)} fields, ctypes has {len(py_names)}")
        for name in c_names:
            if name not in py_names:
                problems.append(f"struct {struct}: field {name} is in C but not in ctypes")
        for name in py_names:
            if name not in c_names:
                problems.append(f"struct {struct}: field {name} is in ctypes but not in C")
        if not problems and c_names != py_names:
            problems.append(f"struct {struct}: field order differs: C {c_names}, ctypes {py_names}")
    _fail_on(problems)


def test_struct_sizes_and_alignment(c_layout):
    problems = []
    for struct, c in c_layout["structs"].items():
        cls = PY_STRUCTS.get(struct)
        if cls is None:
            continue  # test_same_structs reports it
        if c["size"] != ctypes.sizeof(cls):
            problems.append(f"sizeof(struct {struct}): C {c['size']}, ctypes {ctypes.sizeof(cls)}")
        if c["align"] != ctypes.alignment(cls):
            problems.append(f"alignment of struct {struct}: C {c['align']}, ctypes {ctypes.alignment(cls)}")
    _fail_on(problems)


def test_field_offsets_sizes_and_types(c_layout):
    problems = []
    for struct, c_fields in c_layout["fields"].items():
        cls = PY_STRUCTS.get(struct)
        if cls is None:
            continue
        py_types = _py_field_types(struct)
        for name, c in c_fields.items():
            if name not in py_types:
                continue  # test_same_fields_in_same_order reports it
            where = f"{struct}.{name}"
            descr = getattr(cls, name)
            py_type = py_types[name]
            if c["offset"] != descr.offset:
                problems.append(f"offsetof({where}): C {c['offset']}, ctypes {descr.offset}")
            if c["size"] != descr.size:
                problems.append(f"sizeof({where}): C {c['size']}, ctypes {descr.size}")
            py_count = py_type._length_ if issubclass(py_type, ctypes.Array) else 0
            if c["count"] != py_count:
                problems.append(f"array length of {where}: C {c['count']}, ctypes {py_count}")
            if c["type_ok"] != 1:
                problems.append(f"type of {where}: C's is not {c_type_name(py_type)} (the ctypes type)")
    _fail_on(problems)


def test_fields_cover_every_byte(c_layout):
    """No hole, no overlap: a C field missing from C_FIELDS would leave a hole."""
    problems = []
    for struct, c_fields in c_layout["fields"].items():
        end, last = 0, "the start"
        for name, c in sorted(c_fields.items(), key=lambda item: item[1]["offset"]):
            if c["offset"] != end:
                kind = "hole" if c["offset"] > end else "overlap"
                problems.append(
                    f"struct {struct}: {kind} between {last} (ends at {end}) and {name} "
                    f"(starts at {c['offset']}): a field missing from C_FIELDS, or padding the "
                    f"header should make explicit"
                )
            end, last = c["offset"] + c["size"], name
        size = c_layout["structs"][struct]["size"]
        if end != size:
            problems.append(f"struct {struct}: fields end at {end} but the struct has {size} bytes")
    _fail_on(problems)


def test_same_defines(c_layout):
    problems = []
    c_defines = c_layout["defines"]
    py_constants = python_constants()
    for name in sorted(set(c_defines) - set(py_constants)):
        problems.append(f"#define {name} has no twin in hami_jupyter/slice/layout.py")
    for name in sorted(set(py_constants) - set(c_defines)):
        problems.append(f"{name} in hami_jupyter/slice/layout.py has no #define in slice_file.h")
    for name in sorted(set(c_defines) & set(py_constants)):
        py_value = py_constants[name]
        if isinstance(py_value, bytes):
            py_value = py_value.decode("ascii")
        if c_defines[name] != py_value:
            problems.append(f"{name}: C {c_defines[name]!r}, Python {py_value!r}")
    _fail_on(problems)


def test_header_geometry_matches_layout(c_layout):
    """The offsets the header records are those of struct hami_layout."""
    fields = c_layout["fields"]["hami_slice_file"]
    assert layout.LIMITS_OFFSET == fields["limits"]["offset"]
    assert layout.DEVICES_OFFSET == fields["device"]["offset"]
    assert layout.SLOTS_OFFSET == fields["slot"]["offset"]
    assert layout.FILE_SIZE == c_layout["structs"]["hami_slice_file"]["size"]


def test_docs_tables_match(c_layout):
    """docs/slice-file.md shows every struct with the offsets and sizes C has."""
    sections = re.split(r"^### `struct (\w+)` \((\d+) bytes\)$", DOC.read_text(), flags=re.M)
    documented = {}
    for name, size, body in zip(sections[1::3], sections[2::3], sections[3::3]):
        rows = re.findall(r"^\| (\d+) \| (\d+) \| `(\w+)` \|", body, flags=re.M)
        documented[name] = (int(size), [(field, int(off), int(n)) for off, n, field in rows])
    problems = []
    for struct, c_fields in c_layout["fields"].items():
        c_table = (
            c_layout["structs"][struct]["size"],
            [(name, f["offset"], f["size"]) for name, f in c_fields.items()],
        )
        if struct not in documented:
            problems.append(f"struct {struct} has no table")
        elif documented[struct] != c_table:
            problems.append(f"struct {struct}: docs say {documented[struct]}, C says {c_table}")
    assert not problems, f"{DOC} is out of date:\n" + "\n".join(problems)
